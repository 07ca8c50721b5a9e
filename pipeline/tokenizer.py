"""SentencePiece subword models: trained once on a sample of the train split, saved with the data."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from .errors import UserError

# Fixed ids, the same as TransformerConfig's defaults, so the model never needs to be told.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
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
        if self._words is not None:
            return self._encode_words(self.src, self._words[0], texts)
        return self.src.encode(list(texts), out_type=int, num_threads=self.num_threads)

    def encode_tgt(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences to subword ids (no bos/eos)."""
        if self._words is not None:
            return self._encode_words(self.tgt, self._words[1], texts)
        return self.tgt.encode(list(texts), out_type=int, num_threads=self.num_threads)

    def _encode_words(self, processor, cache: dict, texts: Sequence[str]) -> list[list[int]]:
        """The same ids as processor.encode, from each space-separated word's ids, encoded once.

        Exact for the models trained here: SentencePiece splits at spaces before it segments
        (split_by_whitespace), drops extra spaces and normalises nothing ("identity"), so a
        sentence's ids are its words' ids in order. Corpora repeat words far more often than
        they add new ones, which makes this several times faster than encoding every sentence.
        """
        out = []
        for text in texts:
            ids: list[int] = []
            for word in text.split(" "):
                found = cache.get(word)
                if found is None:
                    found = processor.encode(word, out_type=int)
                    if len(cache) < self._word_cache:
                        cache[word] = found
                ids += found
            out.append(ids)
        return out

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
        if (directory / JOINT_FILE).is_file():
            return cls((directory / JOINT_FILE).read_bytes())
        if (directory / SRC_FILE).is_file() and (directory / TGT_FILE).is_file():
            return cls((directory / SRC_FILE).read_bytes(), (directory / TGT_FILE).read_bytes())
        raise UserError(f"{directory}: no SentencePiece model ({JOINT_FILE}, or {SRC_FILE} and {TGT_FILE})")


def _train_model(sentences: Iterable[str], vocab_size: int, model_type: str,
                 character_coverage: float) -> bytes:
    """Train one SentencePiece model in memory and return its serialized proto."""
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type=model_type,
            vocab_size=vocab_size, character_coverage=character_coverage,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
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
