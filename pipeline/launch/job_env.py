"""Secrets for a submitted job (`nmt submit --forward-env`), kept out of its command and its job record.

Ray shows a job's entrypoint, metadata and runtime_env env_vars to anyone who lists jobs, and its
SDK returns env_vars in clear. So forwarded variables travel as a tiny package in the job's
runtime_env py_modules instead (uploaded like the working_dir, named by a content hash), and
`apply()` sets them in every process of the job: `nmt` calls it first (the job's driver), and the
job's runtime_env names `apply_in_worker` as Ray's worker_process_setup_hook, which every worker of
the job (Tune trials, Ray Train's controller and workers) runs before its first task; a sweep's key
is set in the driver alone.

What stays: Ray names the package by a hash of its files, shown in the job's record, so a random
file goes with the values (the name would otherwise let anyone who lists jobs test guesses of them
offline). Ray keeps the package unpacked on every node that ran the job (its cache is trimmed only
past 10 GB), so the job's `nmt` deletes those copies when its command ends (`forget`). The uploaded
package itself stays in the cluster's GCS until Ray drops it, after the job ends (and at least
RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S, 10 minutes, after the upload).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import sys
from pathlib import Path

from ..common import log

PACKAGE = "nmt_forwarded_env"
VARIABLES_FILE = "variables.json"
NONCE_FILE = "nonce"  # random: the package's name in the job record says nothing of the values
FORGET_S = 60.0  # how long a job's end waits for its nodes to delete their copies
logger = log.get("submit")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SETUP_HOOK = f"{__name__}.apply_in_worker"  # the job's worker_process_setup_hook
DRIVER_ONLY = ("NMT_STATE_KEY",)  # a sweep's key (tune/state_seal.py): the job's driver seals, no worker needs it


def write_package(variables: dict[str, str], directory: Path) -> Path:
    """The package directory (for runtime_env py_modules) that carries variables, readable by its owner only."""
    package = directory / PACKAGE
    package.mkdir(mode=0o700)
    (package / "__init__.py").write_text('"""Variables forwarded by nmt submit (see pipeline/launch/job_env.py)."""\n')
    target = package / VARIABLES_FILE
    target.touch(mode=0o600)
    target.write_text(json.dumps(variables))
    (package / NONCE_FILE).write_text(secrets.token_hex(32))
    return package


def unpacked() -> Path | None:
    """This node's copy of the job's package (Ray puts it on the path of the job's processes), or None."""
    spec = importlib.util.find_spec(PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / VARIABLES_FILE).is_file():
            return Path(location)
    return None


def apply(driver: bool = True) -> None:
    """Set the forwarded variables in this process when it runs inside a submitted job; elsewhere do nothing."""
    package = unpacked()
    if package is not None:
        variables = json.loads((package / VARIABLES_FILE).read_text())
        os.environ.update({name: value for name, value in variables.items() if driver or name not in DRIVER_ONLY})


def apply_in_worker() -> None:
    """The job's worker_process_setup_hook: apply(), without what only the job's driver uses."""
    apply(driver=False)


def delete_unpacked() -> bool:
    """Delete this node's copy of the job's package; whether there was one."""
    package = unpacked()
    if package is None or package.name != PACKAGE:
        return False
    shutil.rmtree(package, ignore_errors=True)
    return True


def forget() -> None:
    """At the end of a submitted job's command: delete the forwarded values from every node the job ran on.

    Called while Ray is still connected (the job's driver, before it disconnects); a node it cannot
    reach in FORGET_S keeps its copy until Ray's cache drops it. Never fails the command.
    """
    if unpacked() is None:
        return
    try:
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                _delete_on_nodes(ray)
    except Exception as err:  # a cleanup: the command's own outcome stands
        logger.warning(f"could not delete the forwarded variables from the job's nodes ({type(err).__name__}: "
                       f"{err}); Ray's runtime_env cache on those nodes keeps them until it is trimmed")
    delete_unpacked()


def _delete_on_nodes(ray) -> None:
    """delete_unpacked() on every node where this job ran an actor or a task (Ray's State API says where).

    Only there: a task on another node would first unpack the job's runtime_env, values included.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from ray.util.state import list_actors, list_tasks

    context = ray.get_runtime_context()
    asked = {"address": context.gcs_address, "filters": [("job_id", "=", context.get_job_id())], "limit": 10_000,
             "timeout": 30, "raise_on_missing_output": False}  # this cluster, even beside others on one machine
    ran = [*list_actors(**asked), *list_tasks(**asked)]
    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    nodes = {entry.node_id for entry in ran if entry.node_id} & alive
    if not nodes:
        return
    delete = ray.remote(num_cpus=0, max_retries=0)(delete_unpacked)
    done = [delete.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in sorted(nodes)]
    ready, waiting = ray.wait(done, num_returns=len(done), timeout=FORGET_S)
    logger.debug(f"forwarded variables deleted on {sum(ray.get(ready))} of the job's {len(done)} nodes")
    if waiting:
        logger.warning(f"{len(waiting)} of the job's {len(done)} nodes did not delete the forwarded variables within "
                       f"{FORGET_S:.0f}s; Ray's runtime_env cache there keeps them until it is trimmed")
