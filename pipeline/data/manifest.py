"""A prepared dataset: its manifest (counts, lengths, drops, hashes, layout) and how to read its splits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..common import storage
from ..common.errors import CorpusError
from ..text.tokenizer import Tokenizer

MANIFEST = "manifest.json"
VERSION_PREFIX = "v-"  # on object storage, each preparation's files sit under a version prefix of their own
FORMAT_VERSION = 2  # bump when the layout of prepared data changes


@dataclass
class Manifest:
    """What a prepared dataset holds: counts, lengths, drops per rule, hashes, file layout."""

    path: str
    content: dict[str, Any]

    def split_dir(self, split: str) -> str:
        """Directory of a split's Parquet shards."""
        if split not in self.content["splits"]:
            raise CorpusError(f"{self.path}: no split {split!r}; it has {sorted(self.content['splits'])}")
        return storage.join(self.path, split)

    def read_split(self, split: str, columns: list[str]):
        """A split's columns as one pyarrow Table in corpus order (by "row"), however its shards were written."""
        import pyarrow.parquet as pq

        wanted = ["row", *(c for c in columns if c != "row")]
        return pq.read_table(self.split_dir(split), columns=wanted).sort_by("row")

    def check_files(self) -> None:
        """Every split's Parquet files as the manifest lists them (names and bytes): none missing, cut or added."""
        for split, info in self.content["splits"].items():
            listed = info.get("files")
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
        files = [storage.read_bytes(storage.join(self.path, name)) for name in self.content["tokenizer"]["files"]]
        return Tokenizer(*files)

    @property
    def name(self) -> str:
        """The dataset's directory name under data.output_dir: source, languages and fingerprint."""
        c = self.content
        return f"{c['source']}-{c['src_lang']}-{c['tgt_lang']}-{c['fingerprint']}"

    @property
    def sha256(self) -> str:
        """The dataset's identity: the hash its directory is named after."""
        return self.content["fingerprint"]

    def summary(self) -> str:
        """A few human-readable lines: where the data is, counts and drops per split."""
        lines = [f"prepared data: {self.path}"]
        for split, info in self.content["splits"].items():
            dropped = ", ".join(f"{rule} {n}" for rule, n in info["dropped"].items() if n) or "none"
            lines.append(
                f"  {split:<10} {info['pairs']:>9,} pairs  src {info['src_tokens_mean']:.1f} / tgt "
                f"{info['tgt_tokens_mean']:.1f} tokens on average  dropped: {dropped}"
            )
        tok = self.content["tokenizer"]
        lines.append(f"  tokenizer  {tok['type']} {'joint' if tok['joint'] else 'separate'} "
                     f"vocab {tok['src_vocab_size']}/{tok['tgt_vocab_size']}  sha256 {tok['sha256'][:12]}")
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
    return Manifest(path, content)
