"""Training-step throughput versus torch.nn.Transformer, and decoding with and without the cache.

Prints one JSON object. Runs with torch alone (no Ray, no MLflow), on CPU or an NVIDIA GPU:

    python benchmarks/model_step.py                          # CPU, tiny-sized model
    python benchmarks/model_step.py --device cuda --preset base --dtype bf16 --batch 512 --max-len 64 --compile
    python benchmarks/model_step.py --variants fused_adam,vocab_padded,compiled --no-baseline --decode-presets ""

--variants measures other steps of our model in the same alternating rounds as the eager one:
fused_adam (Adam with fused=True), vocab_padded (the output layer rounded up to a multiple of 128
rows, the same FLOPs counted), compiled (the training loop's compiled step: torch.compile of the
model and of the loss, dynamic shapes, fused Adam on a GPU; --compile-mode picks the mode).
MFU counts 6 x parameters FLOPs per target token (the tied output layer included, attention's
own products not) over the chip's dense peak (--peak-tflops, else known from its name).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from model import Transformer, TransformerConfig, label_smoothed_cross_entropy  # noqa: E402
from model.layers import SinusoidalPositionalEncoding  # noqa: E402

PAD, BOS, EOS = 0, 2, 3


class NNTransformerBaseline(nn.Module):
    """The same model built on torch.nn.Transformer: same sizes, tied embeddings, same positions."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        self.positions = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_positions)
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(
            d_model=cfg.d_model, nhead=cfg.num_heads, num_encoder_layers=cfg.num_encoder_layers,
            num_decoder_layers=cfg.num_decoder_layers, dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout, batch_first=True,
        )

    def embed(self, tokens):
        x = self.embedding(tokens) * math.sqrt(self.cfg.d_model)
        return self.dropout(x + self.positions(tokens.shape[1]))

    def forward(self, src, tgt_in):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=src.device)
        hidden = self.transformer(
            self.embed(src), self.embed(tgt_in), tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=src == PAD, memory_key_padding_mask=src == PAD,
        )
        return hidden @ self.embedding.weight.t()


def make_batches(cfg, num_batches, batch, max_len, device, seed=0):
    """Random sentence pairs of ragged lengths (half to full max_len), padded, as (src, tgt_in, tgt_out)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        src = torch.randint(4, cfg.vocab_size, (batch, max_len), generator=gen)
        tgt = torch.randint(4, cfg.vocab_size, (batch, max_len + 1), generator=gen)
        src_len = torch.randint(max_len // 2, max_len + 1, (batch,), generator=gen)
        tgt_len = torch.randint(max_len // 2, max_len + 1, (batch,), generator=gen)
        positions = torch.arange(max_len + 1)
        src[positions[None, :max_len] >= src_len[:, None]] = PAD
        tgt[positions[None, :] > tgt_len[:, None]] = PAD
        tgt[:, 0] = BOS
        batches.append((src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)))
    return batches


def reference_loss(logits, target, epsilon, pad_id, compute_nll=False):
    """PyTorch's own label-smoothed cross-entropy, the baseline of our fused one (same sums)."""
    flat = target.reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat, ignore_index=pad_id,
                           label_smoothing=epsilon, reduction="sum")
    return loss, None, (flat != pad_id).sum()


def train_throughput(model, batches, dtype, device, warmup=2, loss_fn=label_smoothed_cross_entropy, fused=False):
    """Target tokens per second of forward + backward + Adam over the batches (one host sync at the end)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    autocast = torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32)
    model.train()

    def step(src, tgt_in, tgt_out):
        with autocast:
            logits = model(src, tgt_in)
        loss, _, count = loss_fn(logits, tgt_out, 0.1, PAD)
        optimizer.zero_grad(set_to_none=True)
        (loss / count).backward()
        optimizer.step()
        return count.detach()  # summed on the device: no host sync per step

    for batch in batches[:warmup]:
        step(*batch)
    _sync(device)
    start, tokens = time.perf_counter(), 0
    for batch in batches[warmup:]:
        tokens = tokens + step(*batch)
    tokens = int(tokens)  # waits for the last step
    return tokens / (time.perf_counter() - start)


@torch.no_grad()
def decode_throughput(model, src, steps, cached):
    """Sentences per second of greedy decoding for exactly `steps` tokens (eos banned)."""
    model.eval()
    start = time.perf_counter()
    if cached:
        state = model.start_decoding(src)
        tokens = torch.full((src.shape[0],), BOS, device=src.device)
        for _ in range(steps):
            logits = model.decode_step(tokens, state)
            logits[:, EOS] = float("-inf")
            tokens = logits.argmax(-1)
    else:  # recompute the whole prefix every step; the encoder still runs once
        memory, src_mask = model.encode(src)
        memory_kv = model.decoder.project_memory(memory)
        prefix = torch.full((src.shape[0], 1), BOS, device=src.device)
        for _ in range(steps):
            hidden, _ = model.decoder(prefix, memory_kv, src_mask)
            logits = model.decoder.generator(hidden[:, -1])
            logits[:, EOS] = float("-inf")
            prefix = torch.cat([prefix, logits.argmax(-1, keepdim=True)], dim=1)
    _sync(src.device)
    return src.shape[0] / (time.perf_counter() - start)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# Dense bf16 peaks (TFLOP/s) by device name, most specific first: MFU divides by these.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H20", 148.0),
               ("A100", 312.0), ("L40S", 362.0), ("A10", 125.0))
VARIANTS = ("fused_adam", "vocab_padded", "compiled")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "base", "big"])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=32, help="sentence pairs per batch")
    parser.add_argument("--max-len", type=int, default=32, help="longest sentence in tokens")
    parser.add_argument("--steps", type=int, default=12, help="timed training steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is kept")
    parser.add_argument("--decode-batch", type=int, default=32)
    parser.add_argument("--decode-presets", default="tiny,base",
                        help="comma-separated presets whose greedy decoding is timed ('' for none)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models (inductor)")
    parser.add_argument("--variants", default="", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode of the compiled variant")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="leave out nn.Transformer and the F.cross_entropy loss")
    parser.add_argument("--decode-steps", type=int, default=40)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="dense bf16 peak of the accelerator for MFU (0: by its name; H100/H200 SXM: 989)")
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.variants.split(","))) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def peak_tflops(args, device) -> float | None:
    """The chip's dense peak: --peak-tflops, else from its name; None on a CPU or an unknown chip."""
    if args.peak_tflops or device.type != "cuda":
        return args.peak_tflops or None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


def variant_steps(args, cfg, ours, device) -> dict:
    """Name -> (model, loss function, fused Adam) of each measured step of our model."""
    fused = device.type == "cuda"  # as the training loop sets it
    steps = {"eager": (torch.compile(ours) if args.compile else ours, label_smoothed_cross_entropy, False)}
    for name in filter(None, args.variants.split(",")):
        if name == "fused_adam":
            steps[name] = (ours, label_smoothed_cross_entropy, True)
        elif name == "vocab_padded":
            padded = replace(cfg, vocab_size=-(-cfg.vocab_size // 128) * 128)
            steps[name] = (Transformer(padded).to(device), label_smoothed_cross_entropy, False)
        elif name == "compiled":  # pipeline/train/step.py: the model and the loss compiled, dynamic shapes
            compiled_loss = torch.compile(reference_loss, mode=args.compile_mode, dynamic=True)
            steps[name] = (torch.compile(ours, mode=args.compile_mode, dynamic=True), compiled_loss, fused)
    return steps


def measure_training(args, cfg, ours, batches, dtype, device) -> dict[str, float]:
    """Median target tokens/s of each step, in alternating rounds so that machine noise hits all alike."""
    steps = variant_steps(args, cfg, ours, device)
    if args.baseline:
        baseline = NNTransformerBaseline(cfg).to(device)
        steps["nn_transformer"] = (torch.compile(baseline) if args.compile else baseline,
                                   label_smoothed_cross_entropy, False)
        steps["reference_loss"] = (steps["eager"][0], reference_loss, False)
    rates = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (model, loss_fn, fused) in steps.items():
            rates[name].append(train_throughput(model, batches, dtype, device, loss_fn=loss_fn, fused=fused))
    return {name: statistics.median(values) for name, values in rates.items()}


def measure_decoding(args, device) -> dict:
    """Greedy decoding sentences/s with and without the cache, per preset."""
    decode = {}
    for preset in filter(None, args.decode_presets.split(",")):
        decode_cfg = TransformerConfig.preset(preset, vocab_size=args.vocab_size)
        decoder_model = Transformer(decode_cfg).to(device)
        src = make_batches(decode_cfg, 1, args.decode_batch, args.max_len, device, seed=1)[0][0]
        cached, uncached = [], []
        for _ in range(args.rounds):
            cached.append(decode_throughput(decoder_model, src, args.decode_steps, cached=True))
            uncached.append(decode_throughput(decoder_model, src, args.decode_steps, cached=False))
        decode[preset] = {
            "sentences_per_s_cached": round(statistics.median(cached), 2),
            "sentences_per_s_uncached": round(statistics.median(uncached), 2),
            "cache_speedup": round(statistics.median(cached) / statistics.median(uncached), 2),
        }
    return decode


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    cfg = TransformerConfig.preset(args.preset, vocab_size=args.vocab_size)
    torch.manual_seed(0)
    ours = Transformer(cfg).to(device)
    # Fixed shapes, so each compiled model compiles once (in the warm-up steps, which are not timed).
    batches = make_batches(cfg, args.steps + 2, args.batch, args.max_len, device)
    rates = measure_training(args, cfg, ours, batches, dtype, device)
    decode = measure_decoding(args, device)

    eager = rates["eager"]
    target_tokens = sum(int((b[2] != PAD).sum()) for b in batches) / len(batches)
    # ~6 FLOPs per parameter per token (forward 2, backward 4), the tied output layer included.
    flops_per_token = 6 * ours.num_parameters()
    result = {
        "benchmark": "model_step",
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads",
        "preset": args.preset, "dtype": args.dtype, "parameters": ours.num_parameters(),
        "batch": args.batch, "max_len": args.max_len, "target_tokens_per_batch": round(target_tokens),
        "compile": args.compile,
        "train_tokens_per_s": round(eager, 1),
    }
    if args.baseline:
        result.update({
            "nn_transformer_tokens_per_s": round(rates["nn_transformer"], 1),
            "train_speed_ratio": round(eager / rates["nn_transformer"], 3),
            # Our model with F.cross_entropy(label_smoothing=0.1) in place of the fused loss of model/training.py.
            "reference_loss_tokens_per_s": round(rates["reference_loss"], 1),
            "fused_loss_speedup": round(eager / rates["reference_loss"], 3),
        })
    result["variants"] = {name: {"tokens_per_s": round(rate, 1), "vs_eager": round(rate / eager, 3)}
                          for name, rate in rates.items() if name in VARIANTS}
    result.update({"decode_tokens": args.decode_steps, "decode_batch": args.decode_batch, "decode": decode})
    peak = peak_tflops(args, device)
    if peak:
        result["peak_tflops"] = peak
        result["model_tflops"] = round(eager * flops_per_token / 1e12, 1)
        result["mfu"] = round(eager * flops_per_token / (peak * 1e12), 3)
        for figures in result["variants"].values():
            figures["mfu"] = round(figures["tokens_per_s"] * flops_per_token / (peak * 1e12), 3)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
