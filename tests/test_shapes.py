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
    shapes = ShapePolicy(max_tokens, multiple, buckets)
    batches = shaped_batches(src, tgt, shapes, seed=1, epoch=2)
    flat = np.concatenate(batches)
    assert np.array_equal(np.sort(flat), np.arange(src.size))
    for rows, src_width, tgt_width in batch_shapes(batches, src, tgt, shapes):
        assert src_width % multiple == 0 and tgt_width % multiple == 0
        assert rows * (src_width + tgt_width) <= max_tokens
    for batch, (rows, src_width, tgt_width) in zip(batches, batch_shapes(batches, src, tgt, shapes)):
        assert rows >= batch.size and src[batch].max() <= src_width and tgt[batch].max() + 1 <= tgt_width


def test_an_epoch_has_a_few_shapes_and_every_epoch_the_same_ones():
    src, tgt = _lengths(0, n=20000)
    exact = set(batch_shapes(token_budget_batches(src, tgt, 4096), src, tgt))
    shapes = ShapePolicy(4096, multiple=16, buckets=2)
    per_epoch = [set(batch_shapes(shaped_batches(src, tgt, shapes, seed=0, epoch=e), src, tgt, shapes))
                 for e in range(3)]
    assert per_epoch[0] == per_epoch[1] == per_epoch[2]
    widths = {(s, t) for _, s, t in per_epoch[0]}
    assert len(per_epoch[0]) <= 2 * len(widths) < len(exact) / 4, (len(per_epoch[0]), len(exact))
    # Membership changes between epochs, as with unshaped batches.
    as_sets = [{frozenset(b.tolist()) for b in shaped_batches(src, tgt, shapes, epoch=e)} for e in (0, 1)]
    assert as_sets[0] != as_sets[1]


def test_padding_costs_what_the_policy_adds_and_no_more():
    src, tgt = _lengths(3, n=5000)
    exact = token_budget_batches(src, tgt, 4096)
    assert computed_efficiency(exact, src, tgt) == pytest.approx(padding_efficiency(exact, src, tgt))
    shapes = ShapePolicy(4096, multiple=8, buckets=3)
    efficiency = computed_efficiency(shaped_batches(src, tgt, shapes), src, tgt, shapes)
    # A batch's examples share one width pair, so beyond each example's own rounding the only cost is the
    # padding rows of each width pair's one short batch.
    own = (src + tgt + 1).sum() / sum(w.sum() for w in shapes.widths(src, tgt))
    assert 0.85 * own < efficiency <= own


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
