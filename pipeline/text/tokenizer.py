"""SentencePiece subword models: trained once on a sample of the train split, saved with the data."""

from __future__ import annotations

import hashlib
import io
import os
from array import array
from collections import ChainMap
from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from pathlib import Path

import numpy as np
import pyarrow as pa
import sentencepiece as spm

from ..common.errors import UserError

# Fixed ids, the same as TransformerConfig's defaults, so the model never needs to be told.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_IDS = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
JOINT_FILE, SRC_FILE, TGT_FILE = "spm.model", "spm.src.model", "spm.tgt.model"


class Tokenizer:
    """Source and target SentencePiece models; one shared model when the vocabulary is joint."""

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None = None, num_threads: int = -1,
                 word_cache: int = 0):
        self.src_proto, self.tgt_proto = src_proto, tgt_proto
        self.num_threads = num_threads  # threads per encode call; -1: SentencePiece's default (all cores)
        self.src = spm.SentencePieceProcessor(model_proto=src_proto)
        self.tgt = self.src if tgt_proto is None else spm.SentencePieceProcessor(model_proto=tgt_proto)
        # Up to word_cache words' ids, per side (0: off); see _encode_words.
        self._words: tuple[dict, dict] | None = None
        if word_cache:
            self._words = ({}, {}) if tgt_proto is not None else ({},) * 2
        self._word_cache = word_cache

    @property
    def joint(self) -> bool:
        """True when both languages share one model (and so one vocabulary)."""
        return self.tgt_proto is None

    @property
    def src_vocab_size(self) -> int:
        """Size of the source vocabulary."""
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        """Size of the target vocabulary."""
        return self.tgt.get_piece_size()

    def encode_src(self, texts: Sequence[str]) -> list[list[int]]:
        """Source sentences to subword ids (no bos/eos)."""
        return self._encode(self.src, 0, texts)

    def encode_tgt(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences to subword ids (no bos/eos)."""
        return self._encode(self.tgt, 1, texts)

    def encode_src_array(self, texts: Sequence[str]) -> pa.ListArray:
        """encode_src as an Arrow list<int32> array (built without a Python list per sentence)."""
        return self._encode_array(self.src, 0, texts)

    def encode_tgt_array(self, texts: Sequence[str]) -> pa.ListArray:
        """encode_tgt as an Arrow list<int32> array."""
        return self._encode_array(self.tgt, 1, texts)

    def _encode(self, processor, side: int, texts: Sequence[str]) -> list[list[int]]:
        if self._words is None:
            return processor.encode(list(texts), out_type=int, num_threads=self.num_threads)
        values, offsets = self._encode_words(processor, self._words[side], texts)
        return [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]

    def _encode_array(self, processor, side: int, texts: Sequence[str]) -> pa.ListArray:
        if self._words is None:
            return pa.array(self._encode(processor, side, texts), type=pa.list_(pa.int32()))
        values, offsets = self._encode_words(processor, self._words[side], texts)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    def _encode_words(self, processor, cache: dict, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The same ids as processor.encode, from each space-separated word's ids, encoded once.

        Returns all sentences' ids end to end and the offsets where each sentence starts (and
        where the last ends).

        Exact for the models trained here: SentencePiece splits at spaces before it segments
        (split_by_whitespace), drops extra spaces and normalises nothing ("identity"), so a
        sentence's ids are its words' ids in order. Corpora repeat words far more often than
        they add new ones, which makes this several times faster than encoding every sentence.
        """
        # Every per-word step runs in C (split, set difference, map, b"".join); no Python
        # loop over words or sentences. " ".join + split(" ") gives exactly each text's
        # split(" ") in turn, so the per-text word counts below line the words up again.
        words = " ".join(texts).split(" ")
        lookup = cache
        missing = list(set(words).difference(cache))
        if missing:
            encoded = processor.encode(missing, out_type=int, num_threads=self.num_threads)
            # Stored as packed int32 bytes: one b"".join then concatenates a whole batch's ids.
            # (array "i" is a C int, 32 bits here; it packs a short list twice as fast as NumPy.)
            found = {word: array("i", ids).tobytes() for word, ids in zip(missing, encoded)}
            room = self._word_cache - len(cache)
            if len(found) <= room:
                cache.update(found)
            else:  # the cache is full: keep what fits, look the rest up beside it for this call only
                cache.update(dict(islice(found.items(), max(room, 0))))
                lookup = ChainMap(found, cache)
        pieces = list(map(lookup.__getitem__, words))
        values = np.frombuffer(b"".join(pieces), dtype=np.int32)
        # Sentence i's ids are values[offsets[i]:offsets[i + 1]]: word ends, then token ends.
        word_ends = np.cumsum(np.fromiter(map(str.count, texts, repeat(" ")), dtype=np.int64, count=len(texts)) + 1)
        token_ends = np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))) // 4
        offsets = np.zeros(len(texts) + 1, dtype=np.int32)
        offsets[1:] = token_ends[word_ends - 1] if len(texts) else []
        return values, offsets

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Target ids back to detokenized text."""
        return self.tgt.decode([list(map(int, row)) for row in ids])

    def sha256(self) -> str:
        """Hash of the model file(s): the tokenizer's identity in manifests and tags."""
        digest = hashlib.sha256(self.src_proto)
        if self.tgt_proto is not None:
            digest.update(self.tgt_proto)
        return digest.hexdigest()

    def files(self) -> dict[str, bytes]:
        """File name -> serialized model: what save() writes and a prepared dataset ships."""
        if self.joint:
            return {JOINT_FILE: self.src_proto}
        return {SRC_FILE: self.src_proto, TGT_FILE: self.tgt_proto}

    def save(self, directory: str | Path) -> list[Path]:
        """Write the model file(s) into directory; returns their paths."""
        directory = Path(directory)
        files = self.files()
        for name, proto in files.items():
            (directory / name).write_bytes(proto)
        return [directory / name for name in files]

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """The tokenizer saved in directory by save()."""
        directory = Path(directory)
        return cls.from_files({name: (directory / name).read_bytes() for name in (JOINT_FILE, SRC_FILE, TGT_FILE)
                               if (directory / name).is_file()}, str(directory))

    @classmethod
    def from_files(cls, files: dict[str, bytes], where: str) -> Tokenizer:
        """The tokenizer whose files() these are (file name -> serialized model), read from `where`."""
        if JOINT_FILE in files:
            return cls(files[JOINT_FILE])
        if SRC_FILE in files and TGT_FILE in files:
            return cls(files[SRC_FILE], files[TGT_FILE])
        raise UserError(f"{where}: no SentencePiece model ({JOINT_FILE}, or {SRC_FILE} and {TGT_FILE})")


def _train_model(sentences: Iterable[str], vocab_size: int, model_type: str,
                 character_coverage: float) -> bytes:
    """Train one SentencePiece model in memory and return its serialized proto."""
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type=model_type,
            vocab_size=vocab_size, character_coverage=character_coverage,
            **SPECIAL_IDS,
            # The text is already NFC-normalised by cleaning; "identity" keeps
            # decode(encode(x)) == x instead of silently applying NFKC.
            normalization_rule_name="identity",
            hard_vocab_limit=False,  # a small corpus gets a smaller vocabulary, not an error
            input_sentence_size=0,  # the caller already drew a bounded random sample
            num_threads=os.cpu_count() or 1, minloglevel=2,
        )
    except RuntimeError as err:
        raise UserError(f"SentencePiece training failed: {err}; try a smaller data.vocab_size") from None
    return model.getvalue()


def train_tokenizer(src_texts: Sequence[str], tgt_texts: Sequence[str], vocab_size: int,
                    model_type: str = "bpe", joint: bool = True,
                    character_coverage: float = 1.0) -> Tokenizer:
    """SentencePiece on the given (already sampled and cleaned) sentences; joint or one per side."""
    if not src_texts or not tgt_texts:
        raise UserError("cannot train a tokenizer on an empty training split")
    if joint:
        both = [t for pair in zip(src_texts, tgt_texts) for t in pair]
        return Tokenizer(_train_model(both, vocab_size, model_type, character_coverage))
    return Tokenizer(
        _train_model(src_texts, vocab_size, model_type, character_coverage),
        _train_model(tgt_texts, vocab_size, model_type, character_coverage),
    )
