"""A small demo configuration that trains in well under a minute on one CPU worker."""

from pathlib import Path

from pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "data.demo_sizes={train: 3000, validation: 100, test: 100}", "data.vocab_size=600",
    "model.d_model=64", "model.d_ff=128", "model.num_heads=4", "model.num_layers=1",
    "train.num_workers=1", "train.max_tokens=2048", "train.warmup_steps=50", "train.beam_size=2",
    "train.log_every=5", "train.resource_wait_s=2",
]


def small_config(tmp_path, *extra, tracking_uri: str | None = None):
    """configs/demo.yaml shrunk, with data, runs and the MLflow store under tmp_path."""
    uri = tracking_uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    return load_config(ROOT / "configs" / "demo.yaml",
                       [*SMALL, f"data.output_dir={tmp_path / 'data'}", f"train.storage_path={tmp_path / 'runs'}",
                        f"tracking.tracking_uri={uri}", *extra])
