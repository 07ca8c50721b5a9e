"""Connecting to Ray (RAY_ADDRESS or --address when given, else a local instance) and what the cluster holds."""

from __future__ import annotations

import logging
import os
import re
import sys

from . import compat, log
from .errors import UserError

logger = log.get("ray")
# A line of Ray's C++ core that a worker printed, e.g. "[2026-12-02 13:51:42,566 E 23727 23759]
# core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' ...". Ray writes it to the
# worker's log file in its session directory as well.
RAY_CORE_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+ [DIWEF] \d+ \d+\] \w+\.cc:\d+: ")
# Ray's C++ core of a dying worker announces a stack dump. It follows when Tune stops a trial
# whose workers are mid-step (ASHA's early stops): a hundred lines of frames and a faulthandler
# trace, all in the worker's log file too. The rest of that process's output stays there.
RAY_STACK_DUMP = re.compile(r"\.cc:\d+: Stack trace:\s*$")
# Ray's own actors, whose notices ("Detected that the Ray Train controller actor ... is dead.
# Cleaning up placement group") stay in Ray's log files.
RAY_ACTORS = {"PlacementGroupCleaner"}
# The raylet's notice that a trial's start-up began more worker processes than it has CPUs:
# every Tune trial starts a few actors at once, on any cluster size. Other raylet lines (a
# worker killed for memory, say) still show.
RAYLET_NOTICE = re.compile(r"PYTHON worker processes have been started on node")
# A line of this project's own log format ("[train] step 10/200 ..."; see common/log.py).
OWN_LINE = re.compile(r"^\[[a-z][\w.-]*\] ")


def ensure_ray(address: str | None = None) -> None:
    """Connect to the given cluster, or RAY_ADDRESS, or start a local Ray; reuse a live connection."""
    import ray

    if not ray.is_initialized():
        given = "--address" if address else "RAY_ADDRESS"
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address and address.startswith(("http://", "https://")):
            # The guides set RAY_ADDRESS to the dashboard's URL for `nmt submit`; ray.init takes no URL.
            raise UserError(f"{given} is {address}, a dashboard URL, which `nmt submit` takes: submit the command "
                            f"(nmt submit -- {' '.join(sys.argv[1:2]) or 'COMMAND'} ...), or run it on this machine "
                            f"with `env -u RAY_ADDRESS nmt ...`; --address here is a Ray address (auto, HEAD:6379)")
        # Ray's own INFO lines drown our progress output; warnings and errors still show (`nmt -v`: all).
        context = ray.init(address=address, logging_level=logging.INFO if log.verbose() else logging.WARNING,
                           log_to_driver=True)
        if not log.verbose():
            logger.info(f"Ray's own logs: {context.address_info['session_dir']}/logs (`nmt -v` shows them here)")
    if not log.verbose():
        _tidy_worker_output()


def _tidy_worker_output() -> None:
    """Print the workers' "[stage] ..." lines as written; keep Ray's C++ lines, dumps and notices out.

    Ray prefixes every forwarded line with "(RayTrainWorker pid=...)"; the project's own lines name
    their stage already, so they print bare, and other lines keep the prefix that says where they
    came from. Ray's C++ lines stay in Ray's log files. Ray has no public hook for this, so it wraps
    the forwarding handler Ray registers (compat.worker_output_dispatcher); without it, output stays as it was.
    """
    found = compat.worker_output_dispatcher()
    if found is None:
        return
    dispatcher, lock = found

    def wrap(forward):
        dying: set = set()  # (ip, pid) of workers whose stack dump has begun

        def tidied(data):
            if data.get("actor_name") in RAY_ACTORS or (data.get("ip"), data.get("pid")) in dying:
                return
            lines = data.get("lines", [])
            dump = next((i for i, line in enumerate(lines) if RAY_STACK_DUMP.search(line)), None)
            if dump is not None:
                dying.add((data.get("ip"), data.get("pid")))
                lines = lines[:dump]
            lines = [line for line in lines if not RAY_CORE_LINE.match(line) and not RAYLET_NOTICE.search(line)]
            if any(OWN_LINE.match(line) for line in lines):
                sink = sys.stderr if data.get("is_err") else sys.stdout
                for line in lines:  # in order: an own line bare, the others through Ray's handler
                    if OWN_LINE.match(line):
                        print(line, file=sink, flush=True)
                    else:
                        forward({**data, "lines": [line]})
            elif lines:
                forward({**data, "lines": lines})

        tidied.tidies_worker_output = True
        return tidied

    with lock:
        dispatcher.handlers = [(name, wrap(handler) if name == "ray_print_logs"
                                and not getattr(handler, "tidies_worker_output", False) else handler)
                               for name, handler in dispatcher.handlers]


def state_api_problem() -> str | None:
    """Why Ray's State API (served by the dashboard) cannot be queried, or None when it can.

    Ray Train's placement-group cleaner asks the State API whether a run's controller is still
    alive; without it, the resources of a trial that Tune stops early are never released.
    """
    import ray
    from ray.util.state import list_actors
    from ray.util.state.exception import RayStateApiException

    # The connected cluster's address: without one, Ray picks the newest instance on this machine, which
    # can be another cluster than the one the sweep runs on.
    address = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    try:
        list_actors(address=address, limit=1, timeout=30, raise_on_missing_output=False)
    except (RayStateApiException, ConnectionError, OSError) as err:
        return str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    return None
