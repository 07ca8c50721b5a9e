"""The training step: compiled, it gives eager's loss and gradients, and nothing compiles after the first epoch."""

import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from model import Transformer, TransformerConfig, label_smoothed_cross_entropy
from pipeline.config import load_config
from pipeline.train.batching import shaped_batches
from pipeline.train.shapes import ShapePolicy, batch_shapes
from pipeline.train.shard import TokenShard
from pipeline.train.step import TrainStep, adam, compile_mode, smoothed_cross_entropy

PAD = 0
# Compiled kernels sum in another order than eager ones (and differ across CPUs: AVX-512, AMX): relative
# differences of 1e-6 are typical in float32; these bounds leave two orders of magnitude.
LOSS_RTOL, GRAD_RTOL = 1e-4, 1e-3


def test_the_compilable_loss_equals_the_fused_one_in_value_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(4, 9, 50, requires_grad=True)
    target = torch.randint(4, 50, (4, 9))
    target[1, 5:] = PAD
    fused, _, fused_count = label_smoothed_cross_entropy(logits, target, 0.1, PAD, compute_nll=False)
    (fused_grad,) = torch.autograd.grad(fused, logits)
    plain, plain_count = smoothed_cross_entropy(logits, target, 0.1, PAD)
    (plain_grad,) = torch.autograd.grad(plain, logits)
    assert plain_count == fused_count == 32
    assert plain.item() == pytest.approx(fused.item(), rel=1e-6)
    torch.testing.assert_close(plain_grad, fused_grad, rtol=1e-5, atol=1e-7)


def test_cuda_graph_modes_need_one_micro_batch_per_update():
    cfg = load_config(None, ["train.compile=true", "train.compile_mode=reduce-overhead"]).train
    cuda = torch.device("cuda")  # only its type is read: no GPU needed
    assert compile_mode(cfg, cuda, accumulation=1) == "reduce-overhead"
    assert compile_mode(cfg, cuda, accumulation=2) == "default"  # replays would overwrite accumulated gradients
    assert compile_mode(cfg, torch.device("cpu"), accumulation=2) == "reduce-overhead"  # no CUDA graphs on a CPU
    autotune = load_config(None, ["train.compile=true", "train.compile_mode=max-autotune"]).train
    assert compile_mode(autotune, cuda, accumulation=4) == "max-autotune-no-cudagraphs"
    assert compile_mode(load_config(None, ["train.compile_mode=reduce-overhead"]).train, cuda, 1) is None


def _model(device):
    torch.manual_seed(0)
    cfg = TransformerConfig.preset("tiny", vocab_size=64, d_model=32, d_ff=64, num_heads=2, num_layers=1, dropout=0.0)
    return Transformer(cfg).to(device)


def _shard(n=240, seed=0):
    rng = np.random.default_rng(seed)
    sources = [rng.integers(4, 64, rng.integers(1, 30)).tolist() for _ in range(n)]
    targets = [rng.integers(4, 64, rng.integers(1, 30)).tolist() for _ in range(n)]
    return TokenShard.from_lists(sources, targets)


def _loss_and_grads(step, model, batch):
    model.zero_grad(set_to_none=True)
    loss, count = step(*batch)
    loss.backward()
    return loss.item(), count.item(), torch.cat([p.grad.flatten() for p in model.parameters()])


def _compiled_step_agrees_then_settles(device, mode):
    """Eager and compiled steps on the same shaped batches, then two epochs of compiled updates."""
    torch._dynamo.reset()
    eager_model, compiled_model = _model(device), _model(device)
    eager = TrainStep(eager_model, load_config(None, []).train, PAD, None, device)
    cfg = load_config(None, ["train.compile=true", f"train.compile_mode={mode}"]).train
    compiled = TrainStep(compiled_model, cfg, PAD, None, device)
    shard, shapes = _shard(), ShapePolicy(600, multiple=8, buckets=2)
    epochs = [shaped_batches(shard.src.lengths, shard.tgt.lengths, shapes, seed=0, epoch=e) for e in range(2)]
    assert len(set(batch_shapes(epochs[0], shard.src.lengths, shard.tgt.lengths, shapes))) > 3
    batches = [[[t.to(device) for t in shard.collate(index, shapes=shapes)] for index in epoch] for epoch in epochs]
    counters.clear()
    for batch in batches[0][:3]:  # the same weights: no update in between
        want, got = _loss_and_grads(eager, eager_model, batch), _loss_and_grads(compiled, compiled_model, batch)
        assert got[1] == want[1] and got[0] == pytest.approx(want[0], rel=LOSS_RTOL)
        assert (got[2] - want[2]).norm() <= GRAD_RTOL * want[2].norm()
    optimizer, seen, syncs = adam(compiled_model.parameters(), device), [], []
    for number, epoch in enumerate(batches):
        # After the first epoch, a CUDA step must not wait for the GPU: torch warns on each synchronizing call.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if device.type == "cuda" and number:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                for batch in epoch:
                    loss, _ = compiled(*batch)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            finally:
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
        seen.append((counters["stats"]["unique_graphs"], counters["frames"]["total"]))
    return seen, syncs


@pytest.mark.slow
def test_the_compiled_step_agrees_with_eager_and_compiles_nothing_after_the_first_epoch():
    ((graphs, frames), after_second), _ = _compiled_step_agrees_then_settles(torch.device("cpu"), "default")
    assert after_second == (graphs, frames), "the second epoch compiled again"
    # One graph for the model and one for the loss, whatever the shape: none compiled per shape.
    assert 2 <= graphs <= 3, f"{graphs} graphs: shapes that should share one (dynamic) graph did not"


@pytest.mark.cuda
def test_the_compiled_step_with_cuda_graphs_agrees_with_eager_and_settles(device):
    ((graphs, frames), after_second), syncs = _compiled_step_agrees_then_settles(device, "reduce-overhead")
    assert after_second == (graphs, frames) and 2 <= graphs <= 3
    assert not syncs, f"{len(syncs)} host syncs in an epoch of updates, e.g. {syncs[0]}"
