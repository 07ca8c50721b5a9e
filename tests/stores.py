"""Fresh MLflow SQLite stores for tests, copied from one migrated store instead of migrated one by one.

MLflow runs its schema migrations on every new SQLite store: 1-2 s on an idle 2-core machine and several
seconds beside the suite's other work, against a few milliseconds for a file copy. The template is
migrated once per process and its default experiment removed, so that whoever opens a copy first creates
experiment 0 with its own artifact root, exactly as on a store that MLflow had just made.
"""

import atexit
import contextlib
import shutil
import sqlite3
import tempfile
from functools import cache
from pathlib import Path

from pipeline.track import target


@cache
def _template() -> Path:
    """A migrated store (tracking and registry tables) without its default experiment, removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="nmt-test-store-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "mlflow.db"
    target.check_reachable(f"sqlite:///{path}")  # creates the store as a command would
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # closed, after the deletion is committed
        db.execute("DELETE FROM experiments WHERE experiment_id = 0")
    return path


def sqlite_uri(folder, name: str = "mlflow.db") -> str:
    """The URI of a new SQLite store at folder/name (copied from the template; an existing store is kept)."""
    path = Path(folder) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template(), path)
    return f"sqlite:///{path}"
