"""Environment variables: set for a block of code and restored afterwards, or for a process where it starts.

The one place pipeline/ writes them (besides a submitted job's forwarded variables, launch/job_env.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def _set(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """os.environ with values set (None: unset) inside the block, restored afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        _set(values)
        yield
    finally:
        _set(saved)


def set_for_process(values: dict[str, str | None]) -> None:
    """Set (None: unset) variables for the rest of this process: what a process's start-up settles once."""
    _set(values)


def default_for_process(values: dict[str, str]) -> None:
    """Set the variables not set already, for the rest of this process: settings a user's own value overrides."""
    _set({key: value for key, value in values.items() if key not in os.environ})
