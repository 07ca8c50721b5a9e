"""Shared fixtures: one local Ray instance for the whole session, the Multi30k location."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def multi30k_dir() -> pathlib.Path:
    """The Multi30k corpus (NMT_MULTI30K_DIR, else ../shared/data/multi30k); CI always has it."""
    path = pathlib.Path(os.environ.get("NMT_MULTI30K_DIR", ROOT.parent / "shared" / "data" / "multi30k"))
    if not (path / "train.en").is_file():
        pytest.fail(f"Multi30k not found at {path}; set NMT_MULTI30K_DIR")
    return path


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one (Ray is heavy on 2 cores)."""
    import logging

    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
