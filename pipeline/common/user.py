"""Who runs this command: the name that keeps one person's default runs and sweeps apart from another's."""

from __future__ import annotations

import getpass
import os
import re


def person() -> str:
    """The MLflow login's user name (one per person on a team's server), else the OS user, as a path-safe word.

    On a shared Ray cluster every job runs as the image's user, so the MLflow login, which `nmt submit`
    forwards per person, tells people apart where the OS user cannot.
    """
    name = os.environ.get("MLFLOW_TRACKING_USERNAME", "")
    if not name:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):  # a container's uid with no passwd entry and no USER
            name = f"uid{os.getuid()}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:32] or f"uid{os.getuid()}"
