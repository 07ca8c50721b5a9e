"""A small demo configuration that trains in well under a minute on one CPU worker."""

import os
from pathlib import Path

from stores import sqlite_uri

from pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "data.demo_sizes={train: 3000, validation: 100, test: 100}", "data.vocab_size=600",
    "model.d_model=64", "model.d_ff=128", "model.num_heads=4", "model.num_layers=1",
    "train.num_workers=1", "train.max_tokens=2048", "train.warmup_steps=50", "train.beam_size=2",
    "train.log_every=5", "train.resource_wait_s=2",
]
# Set by conftest for the session: prepared data is content-addressed, so every test with the
# same data settings reuses one preparation instead of paying for its own.
SHARED_DATA_ENV = "NMT_TEST_PREPARED_DIR"


def data_dir(tmp_path) -> str:
    """Where a small config's data is prepared: the session's shared directory, else tmp_path/data."""
    return os.environ.get(SHARED_DATA_ENV) or str(tmp_path / "data")


def small_config(tmp_path, *extra, tracking_uri: str | None = None):
    """configs/demo.yaml shrunk, with runs and the MLflow store under tmp_path (data in the session's shared dir)."""
    uri = tracking_uri or sqlite_uri(tmp_path)
    return load_config(ROOT / "configs" / "demo.yaml",
                       [*SMALL, f"data.output_dir={data_dir(tmp_path)}", f"train.storage_path={tmp_path / 'runs'}",
                        f"tracking.tracking_uri={uri}", *extra])
