"""SentencePiece tokenizers: the word cache that `nmt prepare` encodes with gives SentencePiece's exact ids."""

import pytest
from conftest import multi30k_path
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.data.demo_corpus import generate_pairs
from pipeline.data.encode import normalize
from pipeline.text.tokenizer import Tokenizer, train_tokenizer

# Fewer entries than the distinct words of the texts, with or without Multi30k (the demo corpus alone has ~2,700).
WORD_CACHE = 2000
MULTI30K = multi30k_path()  # None on a clone without the corpus: the demo corpus alone is used then
ODD = ["", " ", "a  b", " leading and trailing ", "tab\tinside", "ä ö ü ß é", "naïve café", "e\u0301 combining",
       "日本語のテキスト", "emoji 🙂 here", "¨ diaeresis alone", "x" * 300, "1,234.5 % $ @", "\u00a0nbsp\u00a0"]


def _sentences() -> list[str]:
    """Multi30k in four languages (when present) and the demo corpus, as `nmt prepare` cleans them."""
    texts = [text for pair in generate_pairs(2000, seed=3) for text in pair]
    for lang in ("en", "de", "fr", "cs"):
        path = MULTI30K / f"train.{lang}" if MULTI30K else None
        if path and path.is_file():
            texts += path.read_text(encoding="utf-8").split("\n")[:3000]
    return [normalize(t) for t in texts]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tokenizers(request):
    texts = _sentences()
    plain = train_tokenizer(texts[::2], texts[1::2], vocab_size=2000, model_type=request.param)
    return plain, Tokenizer(plain.src_proto, word_cache=WORD_CACHE), texts


def test_word_cache_gives_sentencepiece_ids_on_real_corpora(tokenizers):
    plain, cached, texts = tokenizers
    texts = texts + ODD
    assert cached.encode_src(texts) == plain.encode_src(texts)
    assert cached.encode_tgt(texts) == plain.encode_tgt(texts)  # again, now from the cache
    assert cached.encode_tgt_array(texts).to_pylist() == plain.encode_tgt_array(texts).to_pylist() \
        == plain.encode_tgt(texts)
    assert len(cached._words[0]) == WORD_CACHE  # bounded: words beyond it are encoded, not stored


@settings(max_examples=200, deadline=None, database=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=60))
def test_word_cache_gives_sentencepiece_ids_on_any_text(tokenizers, text):
    plain, cached, _ = tokenizers
    assert cached.encode_src([text, normalize(text)]) == plain.encode_src([text, normalize(text)])
    assert cached.encode_src_array([text, "", text]).to_pylist() == plain.encode_src([text, "", text])
