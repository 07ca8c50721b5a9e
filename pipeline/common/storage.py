"""Local paths and storage URIs (s3://, gs://, hf://, ...) through one small interface, via pyarrow.fs.

Schemes that pyarrow has no filesystem for (hf://, az://, ...) go through fsspec, when the
package that implements them is installed (hf:// comes with huggingface_hub).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import pyarrow.fs as pafs

PYARROW_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file", "mock")


def is_uri(path: str) -> bool:
    """True for "scheme://..." storage URIs, False for local paths."""
    return "://" in str(path) and not str(path).startswith("file://")


def absolute(path: str) -> str:
    """A storage URI as it is, a local path made absolute: the form handed to Ray workers and jobs."""
    return str(path) if "://" in str(path) else str(Path(path).expanduser().resolve())


def join(base: str, *parts: str) -> str:
    """Join path components with "/" for URIs and os.path for local paths."""
    return "/".join([str(base).rstrip("/"), *parts]) if is_uri(base) else os.path.join(base, *parts)


def _resolve(path: str) -> tuple[pafs.FileSystem, str]:
    if not is_uri(path):
        return pafs.LocalFileSystem(), os.path.abspath(str(path).removeprefix("file://"))
    scheme = str(path).split("://", 1)[0].lower()
    if scheme in PYARROW_SCHEMES:
        return pafs.FileSystem.from_uri(path)
    import fsspec

    try:
        fs, inner = fsspec.core.url_to_fs(str(path))
    except (ImportError, ValueError) as err:
        from .errors import UserError

        raise UserError(f"{path}: no filesystem for {scheme}:// ({err}); install the package that provides it "
                        f"(hf:// comes with huggingface_hub) or use s3://, gs:// or a local path") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, the path inside it) of a local path or storage URI."""
    return _resolve(path)


def open_input_file(path: str):
    """A seekable binary file (pyarrow's NativeFile: seek, read, tell, size) for a local path or URI."""
    fs, inner = _resolve(path)
    return fs.open_input_file(inner)


def file_info(path: str) -> pafs.FileInfo:
    """pyarrow's FileInfo (type, size, mtime) of the file or directory at path."""
    fs, inner = _resolve(path)
    return fs.get_file_info(inner)


def is_file(path: str) -> bool:
    """Whether a file exists at path."""
    return file_info(path).type == pafs.FileType.File


def is_dir(path: str) -> bool:
    """Whether a directory (on object stores: a prefix with objects under it) exists at path."""
    return file_info(path).type == pafs.FileType.Directory


def list_files(directory: str, pattern: str = "*") -> list[str]:
    """The files directly in directory whose names match the glob pattern, sorted, as paths or URIs."""
    fs, inner = _resolve(directory)
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    names = sorted(info.base_name for info in infos if info.type == pafs.FileType.File)
    return [join(str(directory), name) for name in names if fnmatch.fnmatchcase(name, pattern)]


def glob(base: str, pattern: str) -> list[str]:
    """The files under base that match pattern, a relative path whose last part may hold * ? [...]."""
    folder, _, name = pattern.rpartition("/")
    return list_files(join(str(base), folder) if folder else str(base), name)


def with_scheme(path: str, like: str) -> str:
    """A path as pyarrow's filesystems give it (bucket/key, no scheme) as a URI of like's scheme."""
    if is_uri(like) and not is_uri(path):
        return f"{str(like).split('://', 1)[0]}://{path.lstrip('/')}"
    return path


def exists(path: str) -> bool:
    """Whether a file or directory exists at path."""
    fs, inner = _resolve(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def read_bytes(path: str) -> bytes:
    """The whole content of the file at path."""
    fs, inner = _resolve(path)
    with fs.open_input_stream(inner) as stream:
        return stream.read()


def write_bytes(path: str, data: bytes) -> None:
    """Write a file atomically on local disk (temporary name, then rename); plainly on object stores."""
    if is_uri(path):
        fs, inner = _resolve(path)
        with fs.open_output_stream(inner) as stream:
            stream.write(data)
        return
    target = Path(path.removeprefix("file://"))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    durable_replace(tmp, target)


def durable_replace(tmp: str | Path, target: str | Path) -> None:
    """os.replace that survives a power cut: the file's bytes on disk first, then the rename in its directory.

    Without the first fsync a crash can leave the new name pointing at an empty or partial file.
    """
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    directory = os.open(os.path.dirname(os.path.abspath(target)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_table(path: str, table) -> None:
    """Write a pyarrow Table as one Parquet file, creating its directory (local path or URI)."""
    import pyarrow.parquet as pq

    fs, inner = _resolve(path)
    fs.create_dir(os.path.dirname(inner), recursive=True)  # inner paths use "/" for URIs too
    pq.write_table(table, inner, filesystem=fs)


def temporary_sibling(path: str) -> str:
    """A fresh path next to path, for writing a directory before publishing it under its real name.

    Its name holds this host and process, so that a later call removes what a killed process left.
    """
    parent, name = os.path.split(str(path).rstrip("/"))
    remove_stale(parent, f".tmp-{name}-")
    return join(parent, f".tmp-{name}-{owner()}-{uuid.uuid4().hex[:8]}")


def owner() -> str:
    """This host and process, as temporary names hold them."""
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale(directory: str, prefix: str) -> None:
    """Remove local directories named prefix + owner() + ... whose process, on this host, is gone."""
    host = socket.gethostname()
    if is_uri(directory) or not os.path.isdir(directory):
        return
    for entry in os.scandir(directory):
        owner = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
        if owner.startswith(f"{host}-") and not _alive(owner[len(host) + 1:].split("-", 1)[0]):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return True  # not a name this code wrote: leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_dir(prefix: str) -> str:
    """A fresh local temporary directory named for this process; those of gone processes are removed first.

    A worker killed while reporting leaves its staged checkpoint (a model and optimizer copy) behind.
    """
    root = tempfile.gettempdir()
    remove_stale(root, prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{owner()}-", dir=root)


def publish_dir(tmp: str, final: str, replace: bool = False) -> None:
    """Move a finished directory into place: an atomic rename locally.

    An existing final directory is kept (another process published the same content first), or
    with replace moved aside, the new one renamed in, and the old one deleted. Object stores cannot
    rename a prefix atomically, so there the directory is written in place and readers rely on its
    manifest, which is written last, to know it is complete.
    """
    if is_uri(final):
        raise ValueError("publish_dir is for local paths; write URIs in place with the manifest last")
    Path(final).parent.mkdir(parents=True, exist_ok=True)
    earlier = f"{tmp}.old"
    try:
        if replace and os.path.exists(final):
            os.replace(final, earlier)
        os.replace(tmp, final)
    except OSError:  # another process published the same content first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        shutil.rmtree(earlier, ignore_errors=True)


def file_sizes(directory: str) -> dict[str, int]:
    """{name: bytes} of the files directly in directory (none when it does not exist)."""
    fs, inner = _resolve(directory)
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    return {info.base_name: info.size for info in infos if info.type == pafs.FileType.File}


def parquet_rows(path: str) -> int:
    """Rows of a Parquet file, from its footer."""
    import pyarrow.parquet as pq

    fs, inner = _resolve(path)
    return pq.read_metadata(inner, filesystem=fs).num_rows


def remove_dir(path: str) -> None:
    """Delete a directory tree, ignoring one that is already gone."""
    fs, inner = _resolve(path)
    if fs.get_file_info(inner).type != pafs.FileType.NotFound:
        fs.delete_dir(inner)
