"""Tests of the built-in demo corpus: determinism, splits, lengths and German grammar."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.data.demo_corpus import (
    DEMO_SPLITS,
    MAX_SOURCE_WORDS,
    MIN_SOURCE_WORDS,
    corpus_statistics,
    demo_corpus,
    generate_pairs,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pairs():
    return generate_pairs(5000, seed=0)


@pytest.fixture(scope="module")
def targets(pairs):
    return [tgt for _, tgt in pairs]


def _fingerprint(pairs):
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


def test_same_seed_gives_same_pairs_and_another_seed_others():
    first, second = generate_pairs(1000, seed=3), generate_pairs(1000, seed=3)
    assert first == second
    assert len(first) == 1000
    other = generate_pairs(1000, seed=4)
    assert len(set(first) & set(other)) < 100


def test_fewer_pairs_are_a_prefix_of_more():
    assert generate_pairs(100, seed=2) == generate_pairs(300, seed=2)[:100]


@pytest.mark.parametrize("hash_seed", ["1", "4242"])
def test_same_pairs_in_a_subprocess_with_another_hash_seed(hash_seed):
    code = ("import json; from pipeline.data.demo_corpus import generate_pairs; "
            "print(json.dumps(generate_pairs(300, seed=11)))")
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert [tuple(p) for p in json.loads(out)] == generate_pairs(300, seed=11)


def test_output_is_pinned_across_python_versions():
    # Only rng.random() is drawn, whose stream every Python 3 shares; if this fails after
    # a deliberate grammar change, print _fingerprint(generate_pairs(200)) and update it.
    assert _fingerprint(generate_pairs(200, seed=0)) == GOLDEN_FINGERPRINT


def test_split_counts_and_keys():
    corpus = demo_corpus(num_train=700, num_validation=40, num_test=60, seed=1)
    assert tuple(corpus) == DEMO_SPLITS
    assert [len(corpus[split]) for split in DEMO_SPLITS] == [700, 40, 60]


def test_splits_do_not_overlap_and_are_deterministic():
    corpus = demo_corpus(num_train=2000, num_validation=300, num_test=300, seed=5)
    sources = {split: [src for src, _ in corpus[split]] for split in DEMO_SPLITS}
    all_sources = [src for split in DEMO_SPLITS for src in sources[split]]
    assert len(set(all_sources)) == len(all_sources) == 2600
    assert not set(sources["train"]) & set(sources["test"])
    assert not set(sources["train"]) & set(sources["validation"])
    assert not set(sources["validation"]) & set(sources["test"])
    assert demo_corpus(num_train=2000, num_validation=300, num_test=300, seed=5) == corpus


def test_splits_share_one_length_distribution():
    corpus = demo_corpus(num_train=3000, num_validation=1000, num_test=1000, seed=0)
    means = {split: sum(len(src.split()) for src, _ in corpus[split]) / len(corpus[split])
             for split in DEMO_SPLITS}
    assert max(means.values()) - min(means.values()) < 1.5, means


def test_lengths_are_in_range_and_spread(pairs):
    lengths = [len(src.split()) for src, _ in pairs]
    assert min(lengths) >= MIN_SOURCE_WORDS == 3
    assert max(lengths) <= MAX_SOURCE_WORDS == 30
    assert len(set(lengths)) >= 26  # nearly every length from 3 to 30 occurs
    assert sum(n <= 6 for n in lengths) > 250 and sum(n >= 25 for n in lengths) > 150


def test_text_looks_like_real_sentences(pairs):
    for src, tgt in pairs:
        for text in (src, tgt):
            assert text[0] == text[0].upper() and text.endswith(".")
            assert "  " not in text and " ," not in text and ",," not in text
            assert not text[:-1].endswith(",")


def test_articles_and_adjectives_agree_with_nouns(targets):
    text = " ".join(targets)
    # Hund is masculine, Katze feminine, Auto neuter: the accusative "den" marks Hund.
    assert re.search(r"\bden Hund\b", text)
    assert re.search(r"\bden \w+en Hund\b", text)  # "den großen Hund"
    assert re.search(r"\bein \w+er Hund\b", text)  # "ein großer Hund"
    assert re.search(r"\beinen \w+en Hund\b", text)
    assert re.search(r"\bdie \w+e Katze\b", text) and re.search(r"\bdas \w+e Auto\b", text)
    for wrong in (r"\b(die|das|eine) Hund\b", r"\b(das|den|einen|einem) Katze\b",
                  r"\b(der|die|den|einen) Auto\b", r"\beine \w+er Hund\b"):
        assert not re.search(wrong, text), wrong


def test_dative_and_weak_nouns(targets):
    text = " ".join(targets)
    assert re.search(r"\b(mit|von|bei) den (\w+ )*Kindern\b", text)  # dative plural -n
    assert re.search(r"\b(im|am|zum|beim|vom) \w+", text)  # contracted preposition
    assert re.search(r"\b(den|einen|dem|einem) (\w+ )*Studenten\b", text)  # weak noun


def test_subject_verb_agreement(pairs):
    sources, targets = " ".join(s for s, _ in pairs), " ".join(t for _, t in pairs)
    assert re.search(r"\b(er|sie) sieht\b", targets, re.I)
    assert re.search(r"\b(wir|sie) sehen\b", targets, re.I)
    assert re.search(r"\bich sehe\b", targets, re.I)
    assert not re.search(r"\bich (sieht|sehen|hat|ist)\b", targets, re.I)
    assert not re.search(r"\bwir (sieht|hat|ist|kann)\b", targets, re.I)
    assert not re.search(r"\ber (sehen|haben|sind|können)\b", targets, re.I)
    assert not re.search(r"\b(I|we|they) (sees|has|is|does)\b", sources)
    assert not re.search(r"\b(he|she) (see|have|are|do)\b", sources, re.I)


def test_verb_goes_to_the_end_of_subordinate_clauses(targets):
    verb_final = re.compile(r", (dass|weil) [^,.]* (sieht|sehen|gesehen hat|gesehen haben)[,.]")
    assert sum(bool(verb_final.search(t)) for t in targets) >= 5


def test_verb_second_after_a_fronted_adverb(pairs):
    fronted = [(src, tgt) for src, tgt in pairs if src.startswith("Today ")]
    assert len(fronted) >= 10
    not_verbs = {"der", "die", "das", "ein", "eine", "ich", "er", "sie", "wir", "mein", "kein"}
    for src, tgt in fronted:
        assert tgt.startswith("Heute ")
        assert tgt.split()[1] not in not_verbs, (src, tgt)


def test_participles_and_particles_go_to_the_clause_end(targets):
    assert any(re.search(r"\bhat\b[^,.]* \w+ gesehen[,.]", t) for t in targets)
    assert any(re.search(r"\bholt\b[^,.]* ab[,.]", t) for t in targets)  # "holt ... ab"
    assert any(re.search(r"\bkann\b[^,.]* sehen[,.]", t) for t in targets)


def test_numbers_are_translated_or_copied(pairs):
    assert any(" three " in f" {s} " and " drei " in f" {t} " for s, t in pairs)
    with_digits = [(s, t) for s, t in pairs if re.search(r"\d", s)]
    assert len(with_digits) >= 50
    for src, tgt in with_digits:
        assert re.findall(r"\d+", src) == re.findall(r"\d+", tgt)


def test_negated_indefinite_object_becomes_kein(pairs):
    negated = [(s, t) for s, t in pairs if re.search(r"\b(does|do) not \w+ an? ", s)]
    assert negated
    assert any(re.search(r"\bkein(e|en|es)?\b", t) for _, t in negated)


@pytest.mark.parametrize("name, value", [("num_train", 0), ("num_validation", -1),
                                         ("num_test", 0), ("num_train", 2.5)])
def test_bad_counts_raise_value_error_naming_the_argument(name, value):
    with pytest.raises(ValueError, match=name):
        demo_corpus(**{name: value})


def test_bad_num_pairs_raises_value_error():
    with pytest.raises(ValueError, match="num_pairs"):
        generate_pairs(-1)
    assert generate_pairs(0) == []


def test_corpus_statistics(pairs):
    stats = corpus_statistics(pairs)
    assert stats["num_pairs"] == 5000
    assert 3 == stats["src_len_min"] < stats["src_len_mean"] < stats["src_len_max"] == 30
    assert stats["tgt_len_min"] < stats["tgt_len_mean"] < stats["tgt_len_max"]
    assert 300 <= stats["src_vocab_size"] < stats["tgt_vocab_size"] < 2000
    assert 0.3 < stats["reordered_fraction"] < 0.95
    identity = corpus_statistics([("The dog sees the cat.", "Der Hund sieht die Katze.")])
    assert identity["reordered_fraction"] == 0.0 and identity["src_len_mean"] == 5
    swapped = corpus_statistics([("The dog has seen the cat.", "Der Hund hat die Katze gesehen.")])
    assert swapped["reordered_fraction"] == 1.0
    with pytest.raises(ValueError, match="empty"):
        corpus_statistics([])


GOLDEN_FINGERPRINT = "8525b21e060d6720e304ad6e377e2ed1f3118d4f9e9b6638baf115b73040adb6"
