"""Secrets for a submitted job (`nmt submit --forward-env`), kept out of its command and its job record.

Ray shows a job's entrypoint, metadata and runtime_env env_vars to anyone who lists jobs, and its
SDK returns env_vars in clear. So forwarded variables travel as a tiny package in the job's
runtime_env py_modules instead (uploaded like the working_dir, named by a content hash), and
`apply()` sets them in every process of the job: `nmt` calls it first (the job's driver), and the
job's runtime_env names it as Ray's worker_process_setup_hook, which every worker of the job (Tune
trials, Ray Train's controller and workers) runs before its first task.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

PACKAGE = "nmt_forwarded_env"
VARIABLES_FILE = "variables.json"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SETUP_HOOK = f"{__name__}.apply"  # the job's worker_process_setup_hook


def write_package(variables: dict[str, str], directory: Path) -> Path:
    """The package directory (for runtime_env py_modules) that carries variables, readable by its owner only."""
    package = directory / PACKAGE
    package.mkdir(mode=0o700)
    (package / "__init__.py").write_text('"""Variables forwarded by nmt submit (see pipeline/launch/job_env.py)."""\n')
    target = package / VARIABLES_FILE
    target.touch(mode=0o600)
    target.write_text(json.dumps(variables))
    return package


def apply() -> None:
    """Set the forwarded variables in this process when it runs inside a submitted job; elsewhere do nothing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return
    for location in spec.submodule_search_locations:
        path = Path(location) / VARIABLES_FILE
        if path.is_file():
            os.environ.update(json.loads(path.read_text()))
            return
