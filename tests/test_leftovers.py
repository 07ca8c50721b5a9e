"""What a killed process leaves on local disk (a staged checkpoint, a half-prepared dataset) goes with the next one."""

import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.common import storage

LEAVE = """
import os, sys
from pipeline.common import storage
path = storage.staging_dir("nmt-ckpt-") if sys.argv[1] == "staging" else storage.temporary_sibling(sys.argv[2])
os.makedirs(path, exist_ok=True)
open(os.path.join(path, "model.pt"), "wb").write(b"x" * 1000)
print(path)
os._exit(0)  # as if killed: nothing cleans up
"""


def _left_by_a_dead_process(*args: str) -> Path:
    result = subprocess.run([sys.executable, "-c", LEAVE, *args], capture_output=True, text=True, check=True)
    return Path(result.stdout.strip())


def test_a_staged_checkpoint_of_a_killed_worker_is_removed_by_the_next_staging():
    left = _left_by_a_dead_process("staging")
    assert left.is_dir() and left.parent == Path(tempfile.gettempdir())
    mine = Path(storage.staging_dir("nmt-ckpt-"))
    try:
        assert not left.exists() and mine.is_dir()
        again = Path(storage.staging_dir("nmt-ckpt-"))  # this process is alive: its own stay
        assert mine.is_dir() and again.is_dir()
    finally:
        storage.remove_dir(str(mine))
        storage.remove_dir(str(again))


def test_a_half_prepared_dataset_of_a_killed_prepare_is_removed_by_the_next_one(tmp_path):
    final = tmp_path / "demo-en-de-0123"
    left = _left_by_a_dead_process("sibling", str(final))
    (tmp_path / ".tmp-other-dataset-x").mkdir()  # not this code's name: left alone
    assert left.is_dir() and left.name.startswith(".tmp-demo-en-de-0123-")
    fresh = storage.temporary_sibling(str(final))
    assert not left.exists() and (tmp_path / ".tmp-other-dataset-x").is_dir() and not Path(fresh).exists()


def test_a_durable_write_replaces_the_file_whole(tmp_path, monkeypatch):
    """The new bytes are written and synced under another name before they replace the file: a write cut off
    before the rename leaves the old file whole (a write in place would have truncated it)."""
    import os

    target = tmp_path / "manifest.json"
    target.write_text("old")
    seen: list[tuple[str, bytes]] = []
    real_replace = os.replace

    def replace_after_looking(src, dst):
        seen.append((os.path.basename(src), target.read_bytes()))  # the target as it is just before the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_after_looking)
    storage.write_bytes(str(target), b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    (written_as, before_rename), = seen
    assert written_as != "manifest.json" and before_rename == b"old"

    def power_cut(src, dst):
        raise OSError("cut off before the rename")

    monkeypatch.setattr(os, "replace", power_cut)
    try:
        storage.write_bytes(str(target), b"newer")
    except OSError:
        pass
    assert target.read_bytes() == b"new"
