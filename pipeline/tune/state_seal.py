"""A sweep's Tune state, sealed by the person who wrote it: a resume unpickles nothing anyone else wrote.

`Tuner.restore` unpickles tuner.pkl and the state files beside it (experiment state, searcher and
callback states), and they live on shared storage (a bucket prefix, a shared volume) that other
people's jobs can write. Every write Tune makes in the sweep's directory goes through a
SealedFileSystem, which records each state file's SHA-256 in a seal, `.nmt-state-seal`, signed with
this person's key (HMAC-SHA256) before the file is committed. Every read of a state file is checked
against the seal, so a planted file, or one swapped after the first check, is refused before Tune
unpickles it.

The key: NMT_STATE_KEY when set, else ~/.config/nmt/state.key, made on first use and readable by its
owner only. A job on a shared cluster runs as the image's user, whose home every job shares: a key
file there would be one key for everyone, so in a job the key comes only from NMT_STATE_KEY, which
`nmt submit` sets from the submitter's own key (read on the submitter's machine, sent apart from
the command), for a sweep and for its `--resume` alike.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import posixpath
import secrets
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from ..common import storage
from ..common.errors import UserError
from ..track.provenance import SUBMITTED_BY

KEY_VARIABLE = "NMT_STATE_KEY"
SEAL_NAME = ".nmt-state-seal"  # no .json or .pkl suffix: Tune neither downloads it to staging nor uploads it back
KEPT = 3  # digests kept per file: the file on storage may still be the previous write when a driver is killed
MIN_KEY_CHARS = 32
# Set in a job's processes: by `nmt submit` (who submitted it), and by Ray's Jobs API in any job's driver
# (`ray job submit`, a KubeRay RayJob), whoever submitted it.
JOB_MARKERS = (SUBMITTED_BY, "RAY_JOB_CONFIG_JSON_ENV_VAR")
NO_KEY_IN_JOB = (f"no sweep key in this job: {KEY_VARIABLE} is not set, and a job never uses the key file of the "
                 f"home every job on the cluster shares; submit the sweep with `nmt submit` from your machine (it "
                 f"sends your key), or export {KEY_VARIABLE} there and add --forward-env {KEY_VARIABLE}")


def key_file() -> Path:
    """Where this person's key is kept when NMT_STATE_KEY is not set."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "nmt" / "state.key"


def in_job() -> bool:
    """Whether this process belongs to a job on a cluster, where the home directory is everyone's."""
    return any(os.environ.get(name) for name in JOB_MARKERS)


def key_source() -> str:
    """Where this person's key comes from here, for messages."""
    return KEY_VARIABLE if os.environ.get(KEY_VARIABLE) else str(key_file())


def key_text() -> str:
    """This person's key as text: NMT_STATE_KEY, else the key file (made, 0600, when there is none).

    In a job only NMT_STATE_KEY counts: the key file there is in the home every job shares.
    """
    value = os.environ.get(KEY_VARIABLE, "")
    if not value and in_job():
        raise UserError(NO_KEY_IN_JOB)
    if not value:
        value = _key_file_text()
    if len(value) < MIN_KEY_CHARS:
        raise UserError(f"{key_source()} holds a key of {len(value)} characters; use at least {MIN_KEY_CHARS}, "
                        f"e.g. the content of {key_file()} or `openssl rand -hex 32`")
    return value


def state_key() -> bytes:
    """This person's key for sealing: NMT_STATE_KEY, else the key file here (never in a job: see key_text)."""
    return hashlib.sha256(key_text().encode()).digest()


def _key_file_text() -> str:
    """The key file's content, the file made (0600) when there is none; refused unless it is private."""
    path = key_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole under another name, then linked in: a command starting beside this one never reads it
        # half-written, and if both make one, the first link wins and both use it.
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        with os.fdopen(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(secrets.token_hex(32) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UserError(f"{path} must belong to you and be readable by you alone (chmod 600 {path}): "
                        f"it signs the sweeps you write")
    return path.read_text().strip()


def _mac(key: bytes, files: dict[str, list[str]]) -> str:
    return hmac.new(key, json.dumps(files, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _is_state(name: str) -> bool:
    """The files Tune deserializes on restore: tuner.pkl, *-state-*.json and *.pkl in the sweep's directory."""
    return name.endswith((".pkl", ".json"))


class SealingHandler(pafs.FileSystemHandler):
    """pyarrow's filesystem callbacks: the inner filesystem's, with the sweep directory's state files sealed."""

    def __init__(self, inner: pafs.FileSystem, directory: str, key: bytes | None, files: dict[str, list[str]]):
        self.inner, self.directory, self.key, self.files = inner, directory.rstrip("/"), key, files
        self.lock = threading.Lock()

    def __reduce__(self):
        # A trial's actor gets Tune's filesystem too: it writes only below the sweep's directory, and never
        # gets the key (None: a state file written or read there is refused).
        return SealingHandler, (self.inner, self.directory, None, {})

    def __eq__(self, other) -> bool:
        return isinstance(other, SealingHandler) and (other.inner, other.directory) == (self.inner, self.directory)

    def __ne__(self, other) -> bool:
        return not self == other

    def _state_name(self, path: str) -> str | None:
        path = path.rstrip("/")
        name = posixpath.basename(path)
        return name if posixpath.dirname(path) == self.directory and _is_state(name) else None

    def _seal(self, name: str, digest: str) -> None:
        """Add a digest to the seal and write it, before the file it names is committed."""
        if self.key is None:
            raise UserError(f"{self.directory}/{name}: a sweep's state is written by its driver only")
        with self.lock:
            self.files[name] = [digest, *[d for d in self.files.get(name, []) if d != digest]][:KEPT]
            body = json.dumps({"files": self.files, "mac": _mac(self.key, self.files)}, sort_keys=True).encode()
            with self.inner.open_output_stream(posixpath.join(self.directory, SEAL_NAME)) as out:
                out.write(body)

    def _checked(self, path: str, data: bytes) -> bytes:
        name = posixpath.basename(path.rstrip("/"))
        if self.key is None or hashlib.sha256(data).hexdigest() not in self.files.get(name, []):
            raise UserError(f"{path} was not written by this sweep's owner (no digest of it in {SEAL_NAME} signed "
                            f"with your key): refusing to load it")
        return data

    def open_input_stream(self, path):
        if self._state_name(path) is None:
            return self.inner.open_input_stream(path)
        with self.inner.open_input_stream(path) as stream:
            return pa.BufferReader(self._checked(path, stream.read()))

    def open_input_file(self, path):
        if self._state_name(path) is None:
            return self.inner.open_input_file(path)
        with self.inner.open_input_file(path) as handle:
            return pa.BufferReader(self._checked(path, handle.readall()))

    def open_output_stream(self, path, metadata):
        name = self._state_name(path)
        if name is None:
            return self.inner.open_output_stream(path, metadata=metadata)
        return pa.PythonFile(_SealedWriter(self, name, self.inner.open_output_stream(path, metadata=metadata)),
                             mode="w")

    def open_append_stream(self, path, metadata):
        if self._state_name(path) is not None:
            raise UserError(f"{path}: a sweep's state file is written whole, never appended to")
        return self.inner.open_append_stream(path, metadata=metadata)

    def get_type_name(self):
        return f"sealed-{self.inner.type_name}"

    def normalize_path(self, path):
        return self.inner.normalize_path(path)

    def get_file_info(self, paths):
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.inner.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise UserError("a sweep never deletes the root of its storage")

    def delete_file(self, path):
        self.inner.delete_file(path)

    def move(self, src, dest):
        if self._state_name(dest) is not None:  # Tune writes state in place; a rename would bypass the seal
            raise UserError(f"{dest}: a sweep's state file is written in place, never moved there")
        self.inner.move(src, dest)

    def copy_file(self, src, dest):
        if self._state_name(dest) is not None:
            raise UserError(f"{dest}: a sweep's state file is written in place, never copied there")
        self.inner.copy_file(src, dest)


class _SealedWriter(io.RawIOBase):
    """A state file as Tune writes it: hashed on the way, its digest sealed before the file is committed."""

    def __init__(self, handler: SealingHandler, name: str, target):
        super().__init__()
        self.handler, self.name, self.target, self.hash = handler, name, target, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.hash.update(data)
        self.target.write(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self.handler._seal(self.name, self.hash.hexdigest())
            finally:
                self.target.close()
        super().close()


def _read_seal(inner: pafs.FileSystem, directory: str, key: bytes) -> dict[str, list[str]]:
    """The digests the seal lists, or a UserError when there is none or it was not signed with this key."""
    where = posixpath.join(directory, SEAL_NAME)
    how = "start a new sweep with --set tune.name=NEW (an older nmt did not seal it, or it is someone else's)"
    try:
        with inner.open_input_stream(where) as stream:
            seal = json.loads(stream.read())
        files, mac = seal["files"], seal["mac"]
    except FileNotFoundError:
        raise UserError(f"sweep state at {directory} has no {SEAL_NAME}: refusing to resume what this user did "
                        f"not write; {how}") from None
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{where} is damaged: refusing to resume; {how}") from None
    if not isinstance(files, dict) or not hmac.compare_digest(str(mac), _mac(key, files)):
        raise UserError(f"{where} was not signed with your key ({key_source()}): a sweep resumes only with the "
                        f"key of the person who started it (submitted by them, with the same key); refusing to "
                        f"resume state someone else may have written; {how}")
    return files


def sealed_filesystem(path: str, resume: bool) -> tuple[pafs.FileSystem, str]:
    """(filesystem for Tune, the sweep directory's path in it): every state file written there is sealed.

    resume: the existing state must be sealed with this person's key, every state file in the directory
    listed in the seal, or a UserError says which is not; nothing is unpickled before that.
    """
    inner, directory = storage.filesystem(path)
    key = state_key()
    files: dict[str, list[str]] = {}
    if resume:
        files = _read_seal(inner, directory, key)
        handler = SealingHandler(inner, directory, key, files)
        for info in inner.get_file_info(pafs.FileSelector(directory)):
            if info.type == pafs.FileType.File and _is_state(info.base_name):
                handler.open_input_stream(info.path)  # raises for a file the seal does not list
    return pafs.PyFileSystem(SealingHandler(inner, directory, key, files)), directory
