"""MLflow: runs and metrics, the pictures of a run, publishing the best checkpoint, the model registry."""
