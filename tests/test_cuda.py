"""GPU paths: mixed precision, decoding, checkpoints across devices, NCCL under torchrun, Translator and pyfunc.

Marked `cuda`: collected everywhere, skipped without a GPU. benchmarks/gpu_check.sh runs them on
one; `NMT_TEST_DEVICE=cpu pytest -m cuda` runs them on the CPU to check the tests themselves.
Needs only torch, numpy, pyarrow, sentencepiece, sacrebleu and pyyaml (what a GPU image has):
the torchrun test needs a prepared dataset in NMT_PREPARED_DATA, the pyfunc test MLflow.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from stores import sqlite_uri

from model import Transformer, TransformerConfig, label_smoothed_cross_entropy
from pipeline.common import checkpoint
from pipeline.text.tokenizer import train_tokenizer
from pipeline.text.translator import Translator, translate_ids
from pipeline.train.prefetch import BatchPrefetcher
from pipeline.train.shard import TokenShard

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parents[1]
PAD, BOS = 0, 2
# bf16 keeps 8 bits of mantissa: a summed loss over ~200 tokens agrees to well under 2%, and the
# gradient points the same way (cosine similarity) though single entries can differ more.
BF16_LOSS_RTOL, BF16_GRAD_COSINE = 0.02, 0.99


def _model(device, seed=0, **overrides):
    torch.manual_seed(seed)
    values = dict(vocab_size=64, d_model=64, d_ff=128, num_heads=4, num_layers=2, dropout=0.0)
    values.update(overrides)
    return Transformer(TransformerConfig.preset("tiny", **values)).to(device)


def _batch(device, batch=8, length=12, vocab=64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, length), generator=gen)
    tgt = torch.randint(4, vocab, (batch, length + 1), generator=gen)
    src[1, 7:] = PAD
    tgt[2, 5:] = PAD
    tgt[:, 0] = BOS
    return src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)


def _loss_and_grads(model, batch, dtype):
    model.zero_grad(set_to_none=True)
    src, tgt_in, tgt_out = batch
    with torch.autocast(src.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        logits = model(src, tgt_in)
    loss, _, _ = label_smoothed_cross_entropy(logits, tgt_out, 0.1, PAD, compute_nll=False)
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten().float() for p in model.parameters()])


def test_a_bf16_autocast_step_agrees_with_fp32(device):
    model, batch = _model(device), _batch(device)
    loss32, grad32 = _loss_and_grads(model, batch, None)
    loss16, grad16 = _loss_and_grads(model, batch, torch.bfloat16)
    assert abs(loss16 - loss32) <= BF16_LOSS_RTOL * abs(loss32), (loss16, loss32)
    cosine = torch.nn.functional.cosine_similarity(grad16, grad32, dim=0).item()
    assert cosine >= BF16_GRAD_COSINE, cosine


def test_an_fp16_step_with_grad_scaler_skips_an_inf_and_lowers_the_scale(device):
    model, batch = _model(device), _batch(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 12)
    before = [p.detach().clone() for p in model.parameters()]
    src, tgt_in, tgt_out = batch
    with torch.autocast(device.type, dtype=torch.float16):
        logits = model(src, tgt_in)
    loss, _, _ = label_smoothed_cross_entropy(logits, tgt_out, 0.1, PAD, compute_nll=False)
    scaler.scale(loss).backward()
    next(model.parameters()).grad.view(-1)[0] = float("inf")  # an overflow, as fp16 gradients do at times
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 11  # backed off by half
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the update was skipped
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.float16):
        logits = model(src, tgt_in)
    loss, _, _ = label_smoothed_cross_entropy(logits, tgt_out, 0.1, PAD, compute_nll=False)
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # a finite step goes through
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_incremental_decoding_equals_the_full_pass(device):
    model = _model(device).eval()
    src, tgt_in, _ = _batch(device)
    with torch.no_grad():
        full = model(src, tgt_in)
        state = model.start_decoding(src)
        steps = torch.stack([model.decode_step(tgt_in[:, t], state) for t in range(tgt_in.shape[1])], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("direction", ["device-to-cpu", "cpu-to-device"])
def test_a_checkpoint_moves_between_devices_and_training_continues_alike(device, tmp_path, direction):
    """Weights and Adam moments arrive bit for bit, and the next step matches one from an in-memory copy.

    Both continuations run on the target device: CPU and GPU kernels differ in the last bits, and
    Adam turns such differences in near-zero gradients into whole learning-rate steps.
    """
    source, target = (device, torch.device("cpu")) if direction == "device-to-cpu" else (torch.device("cpu"), device)
    model = _model(source)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    _loss_and_grads(model, _batch(source), None)
    optimizer.step()
    checkpoint.save(tmp_path, 0, {"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    state = checkpoint.load(tmp_path, map_location=target)
    for name, value in model.state_dict().items():
        assert state["model"][name].device.type == target.type
        torch.testing.assert_close(state["model"][name].cpu(), value.cpu(), atol=0, rtol=0)

    def continued(model_state, optimizer_state):
        net = _model(target, seed=7)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        net.load_state_dict(model_state)
        opt.load_state_dict(optimizer_state)
        _loss_and_grads(net, _batch(target, seed=2), None)
        opt.step()
        return net, opt

    moved, moved_optimizer = continued(state["model"], state["optimizer"])
    copied, copied_optimizer = continued(model.state_dict(), optimizer.state_dict())
    for a, b in zip(moved.parameters(), copied.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for a, b in zip(moved.parameters(), copied.parameters()):
        moments, reference = moved_optimizer.state[a], copied_optimizer.state[b]
        assert moments["exp_avg"].device.type == target.type and int(moments["step"]) == 2
        torch.testing.assert_close(moments["exp_avg_sq"], reference["exp_avg_sq"], atol=1e-9, rtol=1e-5)


def test_prefetched_batches_are_pinned_for_a_gpu(device):
    shard = TokenShard.from_lists([[5, 6, 7], [8]], [[9], [10, 11]])
    with BatchPrefetcher(shard, [np.array([0, 1])], pin=device.type == "cuda") as stream:
        batch = next(stream)
    assert all(t.is_pinned() == (device.type == "cuda") for t in batch)
    assert torch.equal(batch[0].to(device, non_blocking=True).cpu(), shard.collate([0, 1])[0])


@pytest.fixture(scope="module")
def tokenizer():
    words = "a small dog runs over the green grass while two men watch the big red ball".split()
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, 8)) for _ in range(300)]
    return train_tokenizer(sentences, sentences, vocab_size=60, model_type="bpe")


def test_translator_decodes_on_the_device_like_the_cpu(device, tokenizer):
    cfg = TransformerConfig.preset("tiny", vocab_size=tokenizer.src_vocab_size, d_model=64, d_ff=128, num_heads=4,
                                   num_layers=2, dropout=0.0)
    torch.manual_seed(0)
    translator = Translator(Transformer(cfg), tokenizer, device=str(device))
    assert next(translator.model.parameters()).device.type == device.type
    texts = ["a small dog runs", "two men watch the big red ball"]
    out = translator.translate(texts, beam_size=3, max_len=10)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    src = torch.tensor(tokenizer.encode_src(texts[:1]))
    with torch.no_grad():
        on_device = translator.model(src.to(device), src.to(device)).cpu()
        on_cpu = translator.model.to("cpu")(src, src)
    torch.testing.assert_close(on_device, on_cpu, atol=1e-4, rtol=1e-4)
    assert translate_ids(translator.model, [src[0].tolist()], beam_size=2, max_len=5)  # back on the CPU, still fine


def test_the_packaged_pyfunc_model_loads_onto_the_device(device, tokenizer, tmp_path):
    pytest.importorskip("mlflow", reason="MLflow is not installed (GPU images without it skip this)")
    import mlflow
    import pandas as pd

    from pipeline.track import registry, tracking

    cfg = TransformerConfig.preset("tiny", vocab_size=tokenizer.src_vocab_size, d_model=32, d_ff=64, num_heads=2,
                                   num_layers=1, dropout=0.0)
    uri = sqlite_uri(tmp_path)
    client = mlflow.MlflowClient(uri)
    run = client.create_run(client.create_experiment("cuda", artifact_location=str(tmp_path / "artifacts")))
    translator = Translator(Transformer(cfg), tokenizer, device="cpu")
    registry.log_model(tracking.Run(uri, run.info.run_id), translator, "a small dog")
    model = registry.load(uri, f"runs:/{run.info.run_id}/model", device=str(device))
    assert model.unwrap_python_model().translator.device.type == device.type
    out = model.predict(pd.DataFrame({"src": ["a small dog", "the green grass"]}), params={"beam_size": 2})
    assert len(out["translation"]) == 2


@pytest.fixture
def prepared_data():
    path = os.environ.get("NMT_PREPARED_DATA")
    if not path:
        pytest.skip("set NMT_PREPARED_DATA to a dataset from `nmt prepare` (benchmarks/gpu_check.sh does)")
    return path


def test_torchrun_world_size_one_trains_and_validates_over_nccl(device, prepared_data, tmp_path):
    """The whole worker loop under torchrun: process group (NCCL on a GPU), DDP, two updates, a validation."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    overrides = ["model.preset=tiny", "model.d_model=64", "model.d_ff=128", "model.num_heads=4", "model.num_layers=2",
                 "train.max_steps=2", "train.log_every=1", "train.max_tokens=2000", "train.beam_size=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "pipeline.train.loop", "--data", prepared_data, "--checkpoints", str(tmp_path),
           "--device", str(device.type), *[arg for o in overrides for arg in ("--set", o)]]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "validation at step 2" in proc.stderr, proc.stderr[-2000:]
    backend = "nccl" if device.type == "cuda" else "gloo"
    assert f"process group: {backend}" in proc.stderr, proc.stderr[-2000:]
    state = checkpoint.load(next(tmp_path.glob("checkpoint_*")))
    assert state["progress"]["step"] == 2 and json.dumps(state["metrics"]["val_bleu"])
