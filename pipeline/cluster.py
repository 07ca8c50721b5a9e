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


def state_api_problem() -> str | None:
    """Why Ray's State API (served by the dashboard) cannot be queried, or None when it can.

    Ray Train's placement-group cleaner asks the State API whether a run's controller is still
    alive; without it, the resources of a trial that Tune stops early are never released.
    """
    from ray.util.state import list_actors
    from ray.util.state.exception import RayStateApiException

    try:
        list_actors(limit=1, timeout=30, raise_on_missing_output=False)
    except (RayStateApiException, ConnectionError, OSError) as err:
        return str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    return None
