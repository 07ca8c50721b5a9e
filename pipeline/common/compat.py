"""The private names of Ray and Python that the pipeline uses, in one place: what each is for, checked against.

No public API does what these do. tests/test_compat.py fails when one of them is gone, or when the
installed Ray is not the one they were checked with (CHECKED_RAY): after an upgrade, check each again,
then move CHECKED_RAY on. Each caller keeps working without its name (the output is chattier, or the
exit slower), never wrong.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

CHECKED_RAY = "2.60.0"

# Loggers of Ray's internals whose notices the pipeline quiets, by name (setting a level imports nothing).
RAY_NOTICE_LOGGERS = (
    "ray._private.authentication.authentication_token_setup",  # "Token authentication is enabled ..." (it is)
    "ray.data._internal.progress",  # "Progress bars disabled" (prepare prints its own progress)
)
RAY_UPLOAD_LOGGERS = ("ray._private.runtime_env.packaging", "ray._private.runtime_env.working_dir")


def ray_train_report_logger() -> str:
    """The logger Ray Train's worker context logs every report's metrics dict with, at INFO."""
    from ray.train.v2._internal.execution import context

    return context.__file__


def worker_output_dispatcher() -> tuple[Any, Any] | None:
    """(Ray's dispatcher of worker output lines to the driver, its lock), or None when Ray no longer has them.

    Its `handlers` are (name, function) pairs; the one named "ray_print_logs" prints worker lines.
    """
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        return dispatcher, dispatcher._lock
    except (ImportError, AttributeError):
        return None


def interpreter_exit_steps() -> tuple[Callable[[], None], Callable[[], None]] | None:
    """(wait for non-daemon threads, run the atexit handlers): CPython's exit without its teardown of modules."""
    wait_for_threads, exit_handlers = getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)
    if wait_for_threads is None or exit_handlers is None:  # not CPython
        return None
    return wait_for_threads, exit_handlers
