"""Connecting to Ray: RAY_ADDRESS or --address when given, else a local instance."""

from __future__ import annotations

import logging
import os


def ensure_ray(address: str | None = None) -> None:
    """Connect to the given cluster, or RAY_ADDRESS, or start a local Ray; reuse a live connection."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    # Ray's own INFO lines drown our progress output; warnings and errors still show.
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
