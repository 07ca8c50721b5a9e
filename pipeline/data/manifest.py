"""A prepared dataset: its manifest (counts, lengths, drops, hashes, layout) and how to read its splits."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ..common import storage
from ..common.errors import CorpusError
from ..text.tokenizer import Tokenizer

MANIFEST = "manifest.json"
VERSION_PREFIX = "v-"  # on object storage, each preparation's files sit under a version prefix of their own
FORMAT_VERSION = 2  # bump when the layout of prepared data changes


@dataclass(frozen=True)
class SplitStats:
    """One split of a prepared dataset: pairs kept and read, drops per rule, token statistics, its files."""

    pairs: int
    read: int
    dropped: dict[str, int]
    src_tokens: int
    tgt_tokens: int
    src_tokens_mean: float
    tgt_tokens_mean: float
    src_tokens_max: int
    tgt_tokens_max: int
    tgt_tokens_p99: float
    files: dict[str, dict[str, int]] | None = None  # name -> {"rows", "bytes"}; None: written before files were listed


@dataclass(frozen=True)
class TokenizerInfo:
    """The SentencePiece model(s) the data was encoded with: files beside the manifest, vocabularies, hash."""

    type: str
    joint: bool
    files: list[str]
    src_vocab_size: int
    tgt_vocab_size: int
    sha256: str
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int


@dataclass(frozen=True)
class Manifest:
    """What a prepared dataset holds (counts, lengths, drops per rule, hashes, file layout); writes and reads itself.

    Written last, as manifest.json beside the splits' Parquet files: its presence marks the data complete.
    """

    path: str  # the dataset's directory (not written: the file is found there)
    fingerprint: str  # the dataset's identity, which its directory is named after
    source: str
    src_lang: str
    tgt_lang: str
    source_sha256: str  # the raw data's hash (kinds.registry.source_fingerprint)
    config_sha256: str  # the data config's hash (the settings that change the prepared pairs)
    data_config: dict[str, Any]
    splits: dict[str, SplitStats]
    tokenizer_info: TokenizerInfo
    created_s: float
    seconds: float  # how long the preparation took
    format_version: int = FORMAT_VERSION

    @property
    def content(self) -> dict[str, Any]:
        """The manifest as manifest.json holds it."""
        return {"format_version": self.format_version, "fingerprint": self.fingerprint, "source": self.source,
                "src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "source_sha256": self.source_sha256,
                "config_sha256": self.config_sha256, "data_config": self.data_config,
                "splits": {split: _without_none(dataclasses.asdict(stats)) for split, stats in self.splits.items()},
                "tokenizer": dataclasses.asdict(self.tokenizer_info),
                "created_s": self.created_s, "seconds": self.seconds}

    @classmethod
    def from_content(cls, path: str, content: dict[str, Any]) -> Manifest:
        """The manifest of manifest.json's content, found at `path`."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"path", "splits", "tokenizer_info"}
        try:
            return cls(path, splits={split: SplitStats(**stats) for split, stats in content["splits"].items()},
                       tokenizer_info=TokenizerInfo(**content["tokenizer"]),
                       **{key: value for key, value in content.items() if key in fields})
        except (KeyError, TypeError) as err:
            raise CorpusError(f"{storage.join(path, MANIFEST)}: not a manifest this version reads ({err}); "
                              "prepare the data again with `nmt prepare --force`") from None

    def write(self) -> None:
        """Write manifest.json into the dataset's directory (the last file a preparation writes)."""
        storage.write_bytes(storage.join(self.path, MANIFEST), json.dumps(self.content, indent=2).encode())

    def write_pointer(self, directory: str) -> None:
        """Publish this version (a prefix inside `directory`, on object storage) as `directory`'s dataset."""
        pointer = {"format_version": self.format_version, "fingerprint": self.fingerprint,
                   "version": self.path.rstrip("/").rsplit("/", 1)[-1], "created_s": self.created_s}
        storage.write_bytes(storage.join(directory, MANIFEST), json.dumps(pointer, indent=2).encode())

    def split_dir(self, split: str) -> str:
        """Directory of a split's Parquet shards."""
        if split not in self.splits:
            raise CorpusError(f"{self.path}: no split {split!r}; it has {sorted(self.splits)}")
        return storage.join(self.path, split)

    def read_split(self, split: str, columns: list[str]):
        """A split's columns as one pyarrow Table in corpus order (by "row"), however its shards were written."""
        import pyarrow.parquet as pq

        wanted = ["row", *(c for c in columns if c != "row")]
        return pq.read_table(self.split_dir(split), columns=wanted).sort_by("row")

    def check_files(self) -> None:
        """Every split's Parquet files as the manifest lists them (names and bytes): none missing, cut or added."""
        for split, stats in self.splits.items():
            listed = stats.files
            if listed is None:  # written before the manifest listed its files
                continue
            found = storage.file_sizes(self.split_dir(split))
            fix = f"prepare it again with `nmt prepare --force` (it is {self.path})"
            for name, expected in sorted(listed.items()):
                if name not in found:
                    raise CorpusError(f"{self.split_dir(split)}: {name} is missing; {fix}")
                if found[name] != expected["bytes"]:
                    raise CorpusError(f"{self.split_dir(split)}: {name} has {found[name]:,} bytes, the manifest "
                                      f"says {expected['bytes']:,} (cut short or rewritten); {fix}")
            extra = sorted(set(found) - set(listed))
            if extra:
                raise CorpusError(f"{self.split_dir(split)}: {extra[0]} is not in the manifest (left by another "
                                  f"preparation?); training would read its rows too; {fix}")

    def tokenizer(self) -> Tokenizer:
        """The SentencePiece model(s) the data was encoded with."""
        files = [storage.read_bytes(storage.join(self.path, name)) for name in self.tokenizer_info.files]
        return Tokenizer(*files)

    @property
    def name(self) -> str:
        """The dataset's directory name under data.output_dir: source, languages and fingerprint."""
        return f"{self.source}-{self.src_lang}-{self.tgt_lang}-{self.fingerprint}"

    @property
    def sha256(self) -> str:
        """The dataset's identity: the hash its directory is named after."""
        return self.fingerprint

    def summary(self) -> str:
        """A few human-readable lines: where the data is, counts and drops per split."""
        lines = [f"prepared data: {self.path}"]
        for split, stats in self.splits.items():
            dropped = ", ".join(f"{rule} {n}" for rule, n in stats.dropped.items() if n) or "none"
            lines.append(
                f"  {split:<10} {stats.pairs:>9,} pairs  src {stats.src_tokens_mean:.1f} / tgt "
                f"{stats.tgt_tokens_mean:.1f} tokens on average  dropped: {dropped}"
            )
        tok = self.tokenizer_info
        lines.append(f"  tokenizer  {tok.type} {'joint' if tok.joint else 'separate'} "
                     f"vocab {tok.src_vocab_size}/{tok.tgt_vocab_size}  sha256 {tok.sha256[:12]}")
        return "\n".join(lines)


def list_files(path: str, splits: list[str]) -> dict[str, dict[str, dict[str, int]]]:
    """{split: {file name: {"rows", "bytes"}}} of a prepared directory's Parquet files: what the manifest lists."""
    listing = {}
    for split in splits:
        directory = storage.join(path, split)
        listing[split] = {name: {"rows": storage.parquet_rows(storage.join(directory, name)), "bytes": size}
                          for name, size in sorted(storage.file_sizes(directory).items())}
    return listing


def load_manifest(path: str) -> Manifest:
    """The manifest of a prepared dataset directory (its presence marks the data complete)."""
    manifest_path = storage.join(path, MANIFEST)
    if not storage.exists(manifest_path):
        raise CorpusError(f"{path}: not a prepared dataset (no {MANIFEST}); run `nmt prepare` first")
    content = json.loads(storage.read_bytes(manifest_path))
    if "version" in content:  # a pointer (object storage): the version it names is the dataset, for good
        return load_manifest(storage.join(path, content["version"]))
    return Manifest.from_content(path, content)


def _without_none(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if value is not None}
