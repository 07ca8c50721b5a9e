"""Who ran what from which commit: the tags that let a team tell its runs apart.

A job from `nmt submit` runs from an upload without `.git`, as the cluster's user: submit records
the submitter and the commit (and whether the tree had uncommitted changes) in the job's
environment, and every process of the job reads them here.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Set by `nmt submit` in the job's runtime_env (none is a secret); read by every process of the job.
SUBMITTED_BY, SUBMITTED_COMMIT, SUBMITTED_DIRTY = "NMT_SUBMITTED_BY", "NMT_GIT_COMMIT", "NMT_GIT_DIRTY"
SUBMITTED_BY_TAG, DIRTY_TAG = "nmt.submitted_by", "nmt.git_dirty"


@dataclass(frozen=True)
class Provenance:
    """The person and the code behind a run."""

    user: str  # the OS user here, or the submitter's for a submitted job
    commit: str  # the git commit, or "unknown"
    dirty: bool | None  # whether the checkout had uncommitted changes (None: not known)
    submitted_by: str = ""  # user@host that ran `nmt submit`, for a submitted job


def os_user() -> str:
    """The name of this process's user, or "unknown" (a uid without a name, as in some containers)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.cache  # the checkout does not change under a running process
def checkout() -> tuple[str, bool | None]:
    """(commit, dirty) of the project's git checkout; ("unknown", None) outside one."""
    commit = (_git("rev-parse", "HEAD") or "").strip() or "unknown"
    if commit == "unknown":
        return commit, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status.strip())


@functools.cache  # a job's variables are set before its processes start
def current() -> Provenance:
    """This process's provenance: the submitter's from a submitted job, else this checkout and user."""
    submitted_by = os.environ.get(SUBMITTED_BY, "")
    if submitted_by:
        dirty = os.environ.get(SUBMITTED_DIRTY, "")
        return Provenance(submitted_by.partition("@")[0], os.environ.get(SUBMITTED_COMMIT) or "unknown",
                          None if not dirty else dirty == "true", submitted_by)
    return Provenance(os_user(), *checkout())


def person(login_user: str = "") -> str:
    """Who runs this command, as a path-safe word for default run and sweep names: the tracking server's login
    (one per person on a team's server), else the submitter of a submitted job, else the OS user.

    On a shared Ray cluster every job runs as the image's user, so that one tells no one apart.
    """
    name = login_user or current().user
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:32] or f"uid{os.getuid()}"


def job_variables() -> dict[str, str]:
    """What `nmt submit` records in a job's environment: who submits it, from which commit, dirty or not."""
    commit, dirty = checkout()
    found = {SUBMITTED_BY: f"{os_user()}@{socket.gethostname()}", SUBMITTED_COMMIT: commit}
    if dirty is not None:
        found[SUBMITTED_DIRTY] = "true" if dirty else "false"
    return found


def git_commit() -> str:
    """The git commit behind this process's runs, or "unknown"."""
    return current().commit


def standard_tags(source: str, login_user: str = "") -> dict[str, str]:
    """MLflow's own tags for who ran what from which commit (the UI's User, Source and Version columns), and ours.

    The user is the tracking server's login when there is one: the name the server knows.
    """
    from mlflow.utils import mlflow_tags

    found = current()
    tags = {mlflow_tags.MLFLOW_USER: login_user or found.user, mlflow_tags.MLFLOW_SOURCE_NAME: source,
            mlflow_tags.MLFLOW_SOURCE_TYPE: "LOCAL"}
    if found.commit != "unknown":
        tags[mlflow_tags.MLFLOW_GIT_COMMIT] = found.commit
    if found.dirty is not None:
        tags[DIRTY_TAG] = str(found.dirty).lower()
    if found.submitted_by:
        tags[SUBMITTED_BY_TAG] = found.submitted_by
    return tags
