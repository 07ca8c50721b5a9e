"""Line-based corpus files (text pairs, TSV, JSONL) checked and read by line-aligned byte ranges.

The driver only plans: it cuts each file into byte ranges that end after a newline (reading a
few bytes per cut) and turns what the scans report into file:line messages. A scan checks its
range once (NUL, UTF-8, columns, JSON) and returns its line count and a sparse line index; a
read turns a range of lines into Arrow columns. Both are plain functions, which `nmt prepare`
runs as Ray tasks: the corpus never passes through the driver. Files are local paths or storage
URIs (s3://, gs://, ...), read by byte range either way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..common import storage
from ..common.errors import CorpusError

CHUNK_BYTES = 64 << 20  # bytes one scan checks: large enough that a task's fixed cost is small
BOM = b"\xef\xbb\xbf"
STRIDE = 4096  # lines between two entries of the sparse line index: a read starts at most this far early


@dataclass(frozen=True)
class LineFormat:
    """How lines become pairs: `text` (two files, one line each), `tsv` or `jsonl` (one file)."""

    kind: str
    src_key: str = ""  # jsonl: the fields (dots nest)
    tgt_key: str = ""
    on_bad_utf8: str = "error"


@dataclass
class LineIndex:
    """Where lines start in one file: every stride-th line of each scanned range, and the end of the file."""

    path: str
    lines: int
    marks: np.ndarray  # line numbers (0-based), ascending; the last is `lines`
    offsets: np.ndarray  # byte offset at which each of those lines starts

    def locate(self, first: int, count: int) -> tuple[int, int, int]:
        """(start byte, lines to skip there, end byte): a byte range that holds lines first..first+count-1."""
        i = int(np.searchsorted(self.marks, first, side="right")) - 1
        j = int(np.searchsorted(self.marks, first + count, side="left"))
        return int(self.offsets[i]), first - int(self.marks[i]), int(self.offsets[j])


def byte_ranges(path: str, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """(start, end) byte ranges that cover the file, each ending just after a newline (the last at the end)."""
    starts = [0]
    with storage.open_input_file(str(path)) as handle:
        size = handle.size()
        while starts[-1] + chunk_bytes < size:
            handle.seek(starts[-1] + chunk_bytes)
            cut = _next_line_start(handle)
            if cut is None or cut >= size:
                break
            starts.append(cut)
    return list(zip(starts, [*starts[1:], size]))


def _next_line_start(handle) -> int | None:
    """The offset just after the next newline from the handle's position, None at the end of the file."""
    while piece := handle.read(1 << 16):
        newline = piece.find(b"\n")
        if newline >= 0:
            return handle.tell() - len(piece) + newline + 1
    return None


def _read_range(path: str, start: int, end: int) -> bytes:
    """Bytes start..end-1 of a local file or storage object (one ranged read on object stores)."""
    with storage.open_input_file(path) as handle:
        return handle.read_at(end - start, start) if end > start else b""


def scan(path: str, start: int, end: int, fmt: LineFormat, stride: int = STRIDE) -> dict:
    """Check a byte range: its line count, the offsets of every stride-th line, its first error (local line, text)."""
    data = _read_range(path, start, end)
    skip = len(BOM) if start == 0 and data.startswith(BOM) else 0
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    count = len(newlines) + (1 if len(data) > skip and not data.endswith(b"\n") else 0)
    line_starts = np.concatenate([[skip], newlines + 1])[:count]
    result = {"lines": count, "marks": (start + line_starts[::stride]).tolist(), "error": None}

    def line_of(position: int) -> int:
        return int(np.searchsorted(newlines, position, side="left")) + 1

    nul = data.find(b"\x00")
    if nul >= 0:
        result["error"] = (line_of(nul), "NUL byte in a text file; is it binary or UTF-16? Convert it to UTF-8")
        return result
    try:
        text = data[skip:].decode("utf-8", errors="strict" if fmt.on_bad_utf8 == "error" else "replace")
    except UnicodeDecodeError as err:
        where = skip + err.start
        result["error"] = (line_of(where), f"invalid UTF-8 ({err.reason} at byte {start + where}); fix the file "
                           "or set data.on_bad_utf8=replace to replace bad bytes with U+FFFD")
        return result
    if fmt.kind != "text":
        for number, line in enumerate(_split_lines(text), start=1):
            try:
                _parse(line, fmt)
            except CorpusError as err:
                result["error"] = (number, str(err))
                return result
    return result


def _split_lines(text: str) -> list[str]:
    """Lines split on \\n only (never on U+2028 or U+0085), the CR of a CRLF removed."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _parse(line: str, fmt: LineFormat) -> tuple[str, str]:
    """One TSV or JSONL line as a (src, tgt) pair; a CorpusError says what is wrong (the caller adds where)."""
    if fmt.kind == "tsv":
        columns = line.split("\t")
        if len(columns) != 2:
            raise CorpusError(f"expected 2 tab-separated columns (source, target), found {len(columns)}")
        return columns[0], columns[1]
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise CorpusError(f"invalid JSON ({err.msg} at column {err.colno})") from None
    return _string_field(record, fmt.src_key), _string_field(record, fmt.tgt_key)


def _string_field(record, key: str) -> str:
    """record["a"]["b"] for key "a.b", which must be a string."""
    value = record
    try:
        for part in key.split("."):
            value = value[part]
    except (KeyError, TypeError, IndexError):
        raise CorpusError(f"field {key!r} is missing; set data.src_field / data.tgt_field") from None
    if not isinstance(value, str):
        raise CorpusError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def run_here(fn, calls: list[tuple]) -> list:
    """Run fn on each argument tuple in this process (small files; `nmt prepare` uses Ray tasks instead)."""
    return [fn(*args) for args in calls]


def read_lines(path: str | Path, on_bad_utf8: str = "error") -> list[str]:
    """The lines of a small UTF-8 text file, checked as strictly as a corpus file."""
    index = index_file(path, LineFormat("text", on_bad_utf8=on_bad_utf8), run_here)
    return read_lines_at(index, 0, index.lines, on_bad_utf8)


def index_file(path: str | Path, fmt: LineFormat, run, chunk_bytes: int = CHUNK_BYTES,
               stride: int = STRIDE) -> LineIndex:
    """Scan a whole file with `run` (run_here or Ray tasks); CorpusError with file:line for its first problem."""
    path = str(path)
    if not storage.is_file(path):
        parent = path.rstrip("/").rsplit("/", 1)[0] if storage.is_uri(path) else os.path.dirname(path) or "."
        siblings = [p.rsplit("/", 1)[-1] for p in storage.list_files(parent)][:12]
        hint = f"; files there: {', '.join(siblings)}" if siblings else ""
        raise CorpusError(f"{path}: file not found{hint}")
    ranges = byte_ranges(path, chunk_bytes)
    results = run(scan, [(path, start, end, fmt, stride) for start, end in ranges])
    before = np.cumsum([0] + [r["lines"] for r in results])
    for lines_before, result in zip(before, results):
        if result["error"]:
            line, text = result["error"]
            raise CorpusError(f"{path}:{int(lines_before) + line}: {text}")
    marks, offsets = [], []
    for lines_before, result in zip(before, results):
        marks += range(int(lines_before), int(lines_before) + result["lines"], stride)
        offsets += result["marks"]
    total = int(before[-1])
    return LineIndex(path, total, np.array([*marks, total], dtype=np.int64),
                     np.array([*offsets, ranges[-1][1] if ranges else 0], dtype=np.int64))


def read_lines_at(index: LineIndex, first: int, count: int, on_bad_utf8: str) -> list[str]:
    """Lines first..first+count-1 of an indexed file."""
    start, skip, end = index.locate(first, count)
    data = _read_range(index.path, start, end)
    text = data.decode("utf-8", errors="strict" if on_bad_utf8 == "error" else "replace")
    return _split_lines(text)[skip:skip + count]


def read_pairs(indexes: list[LineIndex], fmt: LineFormat, first: int, count: int) -> pa.Table:
    """Pairs first..first+count-1 as a (src, tgt) table: from two files (text) or one (tsv, jsonl)."""
    if fmt.kind == "text":
        src, tgt = (read_lines_at(index, first, count, fmt.on_bad_utf8) for index in indexes)
    else:
        pairs = [_parse(line, fmt) for line in read_lines_at(indexes[0], first, count, fmt.on_bad_utf8)]  # scanned
        src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    return pa.table({"src": pa.array(src, pa.string()), "tgt": pa.array(tgt, pa.string())})
