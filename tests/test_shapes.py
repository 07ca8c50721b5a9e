"""Shaped batches: widths to a multiple, rows to a few sizes, within the budget, the same shapes every epoch."""

import numpy as np
import pytest
import torch

from model import Transformer, TransformerConfig, label_smoothed_cross_entropy
from pipeline.config import ConfigError, load_config
from pipeline.train.batching import padding_efficiency, shaped_batches, token_budget_batches
from pipeline.train.prefetch import BatchPrefetcher
from pipeline.train.shapes import ShapePolicy, batch_shapes, computed_efficiency
from pipeline.train.shard import TokenShard

PAD, BOS, EOS = 0, 2, 3


def _lengths(seed, n=3000):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, n)
    return src, np.clip(src + rng.integers(-8, 12, n), 0, 80)


def _shard(n=60, seed=0, longest=20):
    rng = np.random.default_rng(seed)
    sources = [rng.integers(4, 60, rng.integers(1, longest)).tolist() for _ in range(n)]
    targets = [rng.integers(4, 60, rng.integers(0, longest)).tolist() for _ in range(n)]
    return TokenShard.from_lists(sources, targets)


@pytest.mark.parametrize("multiple, buckets", [(8, 0), (8, 3), (16, 2), (1, 2)])
@pytest.mark.parametrize("max_tokens", [600, 4096])
def test_shaped_batches_hold_each_example_once_within_the_budget_padding_included(multiple, buckets, max_tokens):
    src, tgt = _lengths(multiple + buckets)
    shapes = ShapePolicy(max_tokens, multiple, buckets).fitted(src, tgt)
    batches = shaped_batches(src, tgt, shapes, seed=1, epoch=2)
    flat = np.concatenate(batches)
    assert np.array_equal(np.sort(flat), np.arange(src.size))
    for rows, src_width, tgt_width in batch_shapes(batches, src, tgt, shapes):
        assert src_width % multiple == 0 and tgt_width % multiple == 0 and (src_width, tgt_width) in shapes.kept
        assert rows * (src_width + tgt_width) <= max_tokens
    for batch, (rows, src_width, tgt_width) in zip(batches, batch_shapes(batches, src, tgt, shapes)):
        assert rows >= batch.size and src[batch].max() <= src_width and tgt[batch].max() + 1 <= tgt_width


def test_an_epoch_has_a_few_shapes_and_every_epoch_the_same_ones():
    rng = np.random.default_rng(0)  # skewed like real sentence lengths: most short, a long tail
    src = np.clip(rng.lognormal(2.6, 0.45, 20000), 1, 120).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.05, 0.15, src.size), 0, 130).astype(np.int64)
    exact = set(batch_shapes(token_budget_batches(src, tgt, 4096), src, tgt))
    shapes = ShapePolicy(4096, multiple=8, buckets=2).fitted(src, tgt)
    per_epoch = [set(batch_shapes(shaped_batches(src, tgt, shapes, seed=0, epoch=e), src, tgt, shapes))
                 for e in range(3)]
    assert per_epoch[0] == per_epoch[1] == per_epoch[2]
    widths = {(s, t) for _, s, t in per_epoch[0]}
    assert widths == set(shapes.kept)
    assert len(per_epoch[0]) <= 2 * len(widths) < len(exact) / 4, (len(per_epoch[0]), len(exact))
    # Unfitted, every rare width pair of the long tail keeps shapes of its own.
    unfitted = ShapePolicy(4096, multiple=8, buckets=2)
    assert len(set(batch_shapes(shaped_batches(src, tgt, unfitted), src, tgt, unfitted))) > len(per_epoch[0])
    # Membership changes between epochs, as with unshaped batches.
    as_sets = [{frozenset(b.tolist()) for b in shaped_batches(src, tgt, shapes, epoch=e)} for e in (0, 1)]
    assert as_sets[0] != as_sets[1]


def test_padding_costs_what_the_policy_adds_and_no_more():
    src, tgt = _lengths(3, n=5000)
    exact = token_budget_batches(src, tgt, 4096)
    assert computed_efficiency(exact, src, tgt) == pytest.approx(padding_efficiency(exact, src, tgt))
    shapes = ShapePolicy(4096, multiple=8, buckets=3).fitted(src, tgt)
    efficiency = computed_efficiency(shaped_batches(src, tgt, shapes), src, tgt, shapes)
    # A batch's examples share one width pair, so beyond each example's own rounding the cost is the padding
    # rows of each width pair's one short batch, and the rare examples padded up to a common pair.
    own = (src + tgt + 1).sum() / sum(w.sum() for w in shapes.widths(src, tgt))
    assert 0.85 * own < efficiency <= own


def test_a_fitted_policy_pads_rare_width_pairs_to_the_cheapest_common_one_that_holds_them():
    # Width pairs at multiple 8 (source, target + 1): (8, 8) x 50 fills batches of 100 // 16 = 6 rows;
    # (8, 16) x 2 and (16, 8) x 1 do not: (16, 16) x 1 holds both and is itself the widest, so it is kept.
    src = np.array([5] * 50 + [5, 5] + [12] + [12])
    tgt = np.array([5] * 50 + [12, 12] + [5] + [12])
    shapes = ShapePolicy(100, multiple=8, buckets=2).fitted(src, tgt)
    assert shapes.kept == ((16, 16), (8, 8))
    assert shapes.resolve(8, 16) == shapes.resolve(16, 8) == (16, 16) and shapes.resolve(8, 8) == (8, 8)
    assert shapes.resolve(24, 8) == (24, 8)  # wider than any kept pair: its own
    tail = [b for b in shaped_batches(src, tgt, shapes) if b.min() >= 50]
    assert sorted(np.concatenate(tail).tolist()) == [50, 51, 52, 53]  # the tail's batches hold only the tail
    # 100 // 32 = 3 rows: the four come as 3 and 1, the 1 padded to the smaller of the 2 row sizes (3, 2).
    assert sorted(batch_shapes(tail, src, tgt, shapes)) == [(2, 16, 16), (3, 16, 16)]
    shard = TokenShard.from_lists([[4] * n for n in src], [[4] * n for n in tgt])
    assert {tuple(shard.collate(b, shapes=shapes)[1].shape) for b in tail} == {(2, 16), (3, 16)}


def test_collate_pads_to_the_policy_and_its_padding_rows_carry_no_target():
    shard = _shard()
    shapes = ShapePolicy(2000, multiple=8, buckets=2)
    index = np.array([3, 7, 11])
    src, tgt_in, tgt_out = shard.collate(index, shapes=shapes)
    rows, src_width, tgt_width = shapes.shape(shard.src.lengths[index], shard.tgt.lengths[index])
    assert src.shape == (rows, src_width) and tgt_in.shape == tgt_out.shape == (rows, tgt_width) and rows > 3
    exact = shard.collate(index)
    for padded, plain in zip((src, tgt_in, tgt_out), exact):
        assert torch.equal(padded[:3, :plain.shape[1]], plain) and (padded[:3, plain.shape[1]:] == PAD).all()
    assert (src[3:, 0] == EOS).all() and (src[3:, 1:] == PAD).all()  # one source token: no empty attention row
    assert (tgt_in[3:, 0] == BOS).all() and (tgt_out[3:] == PAD).all()
    empty = shard.collate(np.empty(0, np.int64), shapes=shapes)  # a step without examples
    assert (empty[2] == PAD).all() and empty[0].shape[1] == 8
    with BatchPrefetcher(shard, [index, np.empty(0, np.int64)], shapes=shapes) as stream:
        first, second = list(stream)
    assert all(torch.equal(a, b) for a, b in zip(first, (src, tgt_in, tgt_out)))
    assert all(torch.equal(a, b) for a, b in zip(second, empty))


def test_a_shaped_batch_gives_the_loss_and_gradients_of_the_exact_one():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.preset("tiny", vocab_size=64, d_model=32, d_ff=64, num_heads=2,
                                                 num_layers=1, dropout=0.0))
    shard, index = _shard(seed=1), np.arange(10)

    def loss_and_grads(batch):
        model.zero_grad(set_to_none=True)
        src, tgt_in, tgt_out = batch
        loss, _, count = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, 0.1, PAD, compute_nll=False)
        loss.backward()
        return loss.item(), count.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    exact = loss_and_grads(shard.collate(index))
    shaped = loss_and_grads(shard.collate(index, shapes=ShapePolicy(2000, multiple=16, buckets=2)))
    assert shaped[1] == exact[1]
    assert shaped[0] == pytest.approx(exact[0], rel=1e-5)
    torch.testing.assert_close(shaped[2], exact[2], rtol=1e-4, atol=1e-6)


def test_bad_policies_name_the_key():
    with pytest.raises(ValueError, match="ShapePolicy.multiple must be an integer >= 1"):
        ShapePolicy(100, multiple=0)
    with pytest.raises(ConfigError, match=r"train\.pad_multiple must be positive, got 0"):
        load_config(None, ["train.pad_multiple=0"])
    with pytest.raises(ConfigError, match=r"train\.batch_buckets must be >= 0"):
        load_config(None, ["train.batch_buckets=-1"])
    with pytest.raises(ConfigError, match=r"train\.compile_mode must be one of"):
        load_config(None, ["train.compile_mode=fast"])
    src, tgt = np.array([5, 30]), np.array([5, 30])
    with pytest.raises(ValueError, match=r"example 1 .* needs 64 tokens alone, over max_tokens=60"):
        shaped_batches(src, tgt, ShapePolicy(60, multiple=16))
