"""Everything around the model: data preparation, training and tuning on Ray, MLflow tracking, serving."""
