"""Tests of token-budget batching: budget, coverage, determinism, DDP sharding, efficiency."""

import numpy as np
import pytest
from conftest import require_multi30k

from pipeline.train.batching import (
    batch_cost,
    equalize_batch_count,
    padding_efficiency,
    random_batches,
    token_budget_batches,
)

SEEDS = [0, 1, 2, 3]
BUILDERS = [token_budget_batches, random_batches]


def _lengths(seed, n=3000):
    """Ragged sentence-pair lengths: targets follow sources loosely, as in a real corpus."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 80, n)
    tgt = np.clip(src + rng.integers(-10, 15, n), 0, 100)
    return src, tgt


def _costs(batches, src, tgt):
    return [len(b) * (src[b].max() + tgt[b].max() + 1) for b in batches]


def _assert_each_once(batches, n):
    flat = np.concatenate(batches)
    assert flat.size == n, f"{flat.size} indices for {n} examples"
    assert np.array_equal(np.sort(flat), np.arange(n))


def test_batch_cost_counts_padding_and_the_bos_eos_slot():
    src, tgt = np.array([3, 7, 5]), np.array([4, 2, 9])
    assert batch_cost(src, tgt, [0, 1, 2]) == 3 * (7 + 9 + 1)
    assert batch_cost(src, tgt, [1]) == 7 + 2 + 1
    assert batch_cost(src, tgt, []) == 0


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("max_tokens", [300, 2048, 25000])
@pytest.mark.parametrize("seed", SEEDS)
def test_budget_never_exceeded_and_each_example_once(builder, max_tokens, seed):
    src, tgt = _lengths(seed)
    batches = builder(src, tgt, max_tokens, seed=seed, epoch=seed)
    assert all(len(b) > 0 for b in batches)
    assert max(_costs(batches, src, tgt)) <= max_tokens
    _assert_each_once(batches, src.size)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_batches_fill_greedily(seed):
    src, tgt = _lengths(seed)
    batches = random_batches(src, tgt, 2048, seed=seed)
    # The baseline keeps its random order, so each batch must be unable to take the next example.
    for batch, following in zip(batches, batches[1:]):
        assert batch_cost(src, tgt, np.append(batch, following[0])) > 2048


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("seed", SEEDS)
def test_same_seed_and_epoch_repeat_and_other_epochs_differ(builder, seed):
    src, tgt = _lengths(seed)
    first = builder(src, tgt, 2048, seed=seed, epoch=0)
    again = builder(src, tgt, 2048, seed=seed, epoch=0)
    assert len(first) == len(again) and all(np.array_equal(a, b) for a, b in zip(first, again))
    for other in (builder(src, tgt, 2048, seed=seed, epoch=1), builder(src, tgt, 2048, seed=seed + 10, epoch=0)):
        assert not np.array_equal(np.concatenate(first), np.concatenate(other))


@pytest.mark.parametrize("seed", SEEDS)
def test_epochs_change_batch_membership_not_just_order(seed):
    src, tgt = _lengths(seed)
    as_sets = [
        {frozenset(b.tolist()) for b in token_budget_batches(src, tgt, 2048, seed=seed, epoch=e)} for e in (0, 1)
    ]
    assert as_sets[0] != as_sets[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_length_sorted_batches_pad_far_less_than_random_ones(seed):
    # Enough examples that a batch of ~40 finds partners of nearly equal lengths (with 3000, ~0.89).
    src, tgt = _lengths(seed, n=10000)
    bucketed = padding_efficiency(token_budget_batches(src, tgt, 4096, seed=seed), src, tgt)
    baseline = padding_efficiency(random_batches(src, tgt, 4096, seed=seed), src, tgt)
    assert bucketed >= 0.9
    assert bucketed > baseline + 0.3, (bucketed, baseline)


def test_padding_efficiency_matches_a_hand_count():
    src, tgt = np.array([2, 4, 1]), np.array([3, 3, 0])
    # Real: (2+3+1) + (4+3+1) + (1+0+1) = 16; padded: 2 * (4+3+1) + 1 * (1+0+1) = 18.
    assert padding_efficiency([np.array([0, 1]), np.array([2])], src, tgt) == pytest.approx(16 / 18)
    with pytest.raises(ValueError):
        padding_efficiency([], src, tgt)


@pytest.mark.parametrize("builder", BUILDERS)
def test_an_example_over_the_budget_is_named(builder):
    src, tgt = np.full(50, 10), np.full(50, 10)
    src[17], tgt[17] = 70, 40
    named = r"example 17 \(source length 70, target length 40\).*max_tokens=100"
    with pytest.raises(ValueError, match=named) as err:
        builder(src, tgt, 100)
    assert "data.max_len" in str(err.value)


@pytest.mark.parametrize(
    ("src", "tgt", "max_tokens"),
    [
        (np.array([1, 2]), np.array([1]), 100),
        (np.array([1, -2]), np.array([1, 1]), 100),
        (np.array([1.5, 2.0]), np.array([1, 1]), 100),
        (np.array([1, 2]), np.array([1, 1]), 0),
    ],
)
def test_bad_lengths_or_budget_are_value_errors(src, tgt, max_tokens):
    with pytest.raises(ValueError):
        token_budget_batches(src, tgt, max_tokens)


@pytest.mark.parametrize("extra", [0, 1, 7, 40])
@pytest.mark.parametrize("seed", SEEDS)
def test_equalize_reaches_the_count_within_budget(seed, extra):
    src, tgt = _lengths(seed)
    batches = token_budget_batches(src, tgt, 2048, seed=seed)
    equal = equalize_batch_count(batches, len(batches) + extra, src, tgt)
    assert len(equal) == len(batches) + extra
    assert max(_costs(equal, src, tgt)) <= 2048
    _assert_each_once(equal, src.size)
    if extra == 0:
        assert all(np.array_equal(a, b) for a, b in zip(equal, batches))


def test_equalize_splits_the_costliest_batch_first():
    src, tgt = np.array([1, 1, 9, 9, 1, 1]), np.array([1, 1, 9, 9, 1, 1])
    batches = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    equal = equalize_batch_count(batches, 4, src, tgt)
    assert [b.tolist() for b in equal] == [[0, 1], [2], [3], [4, 5]]


def test_equalize_can_split_down_to_single_examples():
    src, tgt = _lengths(0, n=30)
    equal = equalize_batch_count(random_batches(src, tgt, 4096), 30, src, tgt)
    assert sorted(b.item() for b in equal) == list(range(30))


def test_equalize_refuses_impossible_counts():
    src, tgt = _lengths(0, n=30)
    batches = random_batches(src, tgt, 500)
    with pytest.raises(ValueError, match="down to"):
        equalize_batch_count(batches, len(batches) - 1, src, tgt)
    with pytest.raises(ValueError, match="31 batches from 30 examples"):
        equalize_batch_count(batches, 31, src, tgt)


@pytest.mark.parametrize("num_replicas", [2, 3, 4])
def test_per_rank_batch_lists_equalize_to_the_largest_count(num_replicas):
    # The train loop's way: each rank batches its own data shard, they agree on the max count.
    src, tgt = _lengths(5)
    shards = [(src[r::num_replicas], tgt[r::num_replicas]) for r in range(num_replicas)]
    per_rank = [token_budget_batches(s, t, 1000) for s, t in shards]
    target = max(len(b) for b in per_rank)
    assert min(len(b) for b in per_rank) < target, "the shards should start out uneven"
    for (s, t), batches in zip(shards, per_rank):
        equal = equalize_batch_count(batches, target, s, t)
        assert len(equal) == target
        assert max(_costs(equal, s, t)) <= 1000
        _assert_each_once(equal, s.size)


# Real data: Multi30k through a SentencePiece joint BPE, the project's tokenization recipe.


@pytest.fixture(scope="module")
def multi30k_lengths(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    corpus = require_multi30k()
    files = [corpus / "train.en", corpus / "train.de"]
    prefix = tmp_path_factory.mktemp("spm") / "joint"
    spm.SentencePieceTrainer.train(
        input=[str(f) for f in files], model_prefix=str(prefix), vocab_size=8000, model_type="bpe",
        input_sentence_size=200000, shuffle_input_sentence=True, character_coverage=1.0,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, num_threads=2, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    lengths = []
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        lengths.append(np.array([len(ids) for ids in sp.encode(lines)]))
    assert lengths[0].size == lengths[1].size > 20000
    return lengths


def test_multi30k_token_budget_batches_pad_little(multi30k_lengths):
    src, tgt = multi30k_lengths
    batches = token_budget_batches(src, tgt, 4096)
    _assert_each_once(batches, src.size)
    assert max(_costs(batches, src, tgt)) <= 4096
    efficiency = padding_efficiency(batches, src, tgt)
    baseline = padding_efficiency(random_batches(src, tgt, 4096), src, tgt)
    assert efficiency >= 0.9, efficiency
    assert efficiency > baseline + 0.3, (efficiency, baseline)
