"""This project's Transformer against Hugging Face's MarianMT at identical size, side by side on one machine.

Both models get the same configuration (d_model 128, d_ff 256, 4 heads, 4+4 layers, joint vocabulary
8,000, tied embeddings, post-norm, sinusoidal positions, ReLU), random weights, and the same inputs:

- training: the same padded batches, the same label-smoothed loss and Adam, target tokens per second;
- beam search (beam 5) and greedy decoding: the same sources, every output 40 tokens long, generated
  tokens per second.

The two sides alternate in blocks so that machine noise hits both alike; the median of the rounds is kept.
CTranslate2 (int8 and float32 exports of our model, `pipeline/text/ct2.py`) decodes the same sources too.
Prints one JSON object. Needs the benchmark extra (`pip install -e '.[bench,ct2]'`: transformers, ctranslate2):

    python benchmarks/peer_hf.py                 # 2 threads, as on the project's 2-core machine
    python benchmarks/peer_hf.py --rounds 5 --threads 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from model_step import BOS, EOS, PAD, make_batches, train_throughput  # noqa: E402

from model import Transformer, TransformerConfig, beam_search, greedy_search  # noqa: E402


def marian_like(cfg: TransformerConfig) -> nn.Module:
    """Hugging Face's MarianMT configured as cfg; forward(src, tgt_in) -> logits like ours."""
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.num_encoder_layers, decoder_layers=cfg.num_decoder_layers,
        encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function="relu",
        dropout=cfg.dropout, attention_dropout=0.0, activation_dropout=0.0,
        max_position_embeddings=cfg.max_positions, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS,
        decoder_start_token_id=BOS, forced_eos_token_id=None,
    )

    class Marian(nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = MarianMTModel(config)

        def forward(self, src, tgt_in):
            return self.hf(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in).logits

    return Marian()


def sources(cfg: TransformerConfig, count: int, batch: int, seed: int = 1) -> list[torch.Tensor]:
    """Padded batches of random source sentences of 8 to 30 tokens (ending in eos)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 31, (count,), generator=gen)
    batches = []
    for start in range(0, count, batch):
        rows = lengths[start:start + batch]
        src = torch.full((len(rows), int(rows.max())), PAD)
        for i, length in enumerate(rows.tolist()):
            src[i, :length - 1] = torch.randint(4, cfg.vocab_size, (length - 1,), generator=gen)
            src[i, length - 1] = EOS
        batches.append(src)
    return batches


@torch.no_grad()
def ours_decode(model: Transformer, batches: list[torch.Tensor], beam: int, length: int) -> tuple[float, int]:
    """Seconds and generated tokens (eos counted) of our search over the batches."""
    model.eval()
    start, tokens = time.perf_counter(), 0
    for src in batches:
        out = beam_search(model, src, beam, 0.6, max_len=length) if beam > 1 else greedy_search(model, src, length)
        tokens += sum(len(h) + 1 for h in out)
    return time.perf_counter() - start, tokens


@torch.no_grad()
def hf_decode(model: nn.Module, batches: list[torch.Tensor], beam: int, length: int) -> tuple[float, int]:
    """Seconds and generated tokens of Hugging Face's generate() over the batches."""
    model.eval()
    start, tokens = time.perf_counter(), 0
    for src in batches:
        out = model.hf.generate(input_ids=src, attention_mask=src != PAD, num_beams=beam, do_sample=False,
                                max_new_tokens=length + 1, min_new_tokens=length + 1,
                                **({"length_penalty": 0.6} if beam > 1 else {}))
        tokens += int((out[:, 1:] != PAD).sum())  # the decoder start token is not generated
    return time.perf_counter() - start, tokens


def _token(i: int) -> str:
    """A made-up vocabulary for CTranslate2, which takes tokens as strings: the specials, then t4, t5, ..."""
    return {PAD: "<pad>", 1: "<unk>", BOS: "<s>", EOS: "</s>"}.get(i, f"t{i}")


def ct2_engines(model: Transformer, threads: int, workdir: str) -> dict[str, object]:
    """Our model exported to CTranslate2, int8 and float32, each loaded on the CPU as `nmt` loads it."""
    from pipeline.text.ct2 import load_engine, write_model

    vocab = [_token(i) for i in range(model.cfg.vocab_size)]
    return {q: load_engine(write_model(model, vocab, vocab, f"{workdir}/{q}", q), threads=threads)
            for q in ("int8", "float32")}


def ct2_decode(engine, batches: list[torch.Tensor], beam: int, length: int) -> tuple[float, int]:
    """Seconds and generated tokens (eos counted) of CTranslate2 over the batches, queued together."""
    start = time.perf_counter()
    pending = [result for src in batches for result in engine.translate_batch(
        [[_token(i) for i in row if i != PAD] for row in src.tolist()], beam_size=beam, length_penalty=0.6,
        max_batch_size=src.shape[0], min_decoding_length=length + 1, max_decoding_length=length + 1,
        asynchronous=True)]
    tokens = sum(min(len(r.result().hypotheses[0]) + 1, length + 1) for r in pending)
    return time.perf_counter() - start, tokens


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=10, help="timed training steps per round")
    parser.add_argument("--batch", type=int, default=128, help="sentence pairs per training batch (~4k tokens)")
    parser.add_argument("--sentences", type=int, default=256, help="sources decoded per round")
    parser.add_argument("--length", type=int, default=40, help="output tokens per sentence, before eos")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    cfg = TransformerConfig(vocab_size=8000, d_model=128, d_ff=256, num_heads=4, num_encoder_layers=4,
                            num_decoder_layers=4, dropout=0.1, max_positions=256)
    torch.manual_seed(0)
    ours, hf = Transformer(cfg), marian_like(cfg)
    hf_params = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    assert ours.num_parameters() == hf_params, (ours.num_parameters(), hf_params)
    device = torch.device("cpu")
    train_batches = make_batches(cfg, args.train_steps + 2, args.batch, 32, device)
    decode_batches = sources(cfg, args.sentences, 32)

    measured: dict[str, list[float]] = {}
    lengths: dict[str, int] = {}
    workdir = tempfile.mkdtemp(prefix="peer-ct2-")
    engines = ct2_engines(ours, args.threads, workdir)
    sides = [("ours", ours, ours_decode), ("hf", hf, hf_decode),
             *((f"ct2_{q}", engine, ct2_decode) for q, engine in engines.items())]
    for _ in range(args.rounds):  # alternate so that machine noise hits every side alike
        for side, model, decode in sides:
            if side in ("ours", "hf"):
                measured.setdefault(f"{side}_train", []).append(
                    train_throughput(model, train_batches, torch.float32, device))
            for name, beam in (("beam5", 5), ("greedy", 1)):
                seconds, tokens = decode(model, decode_batches, beam, args.length)
                measured.setdefault(f"{side}_{name}", []).append(tokens / seconds)
                lengths[f"{side}_{name}"] = tokens
    shutil.rmtree(workdir, ignore_errors=True)
    median = {key: statistics.median(values) for key, values in measured.items()}
    decoding = {f"{name}_tokens_per_s": {side: round(median[f"{side}_{name}"]) for side, _, _ in sides}
                for name in ("beam5", "greedy")}
    result = {
        "benchmark": "peer_hf",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"{args.threads} threads",
        "parameters": ours.num_parameters(), "train_batch": args.batch, "sentences": args.sentences,
        "train_tokens_per_s": {"ours": round(median["ours_train"]), "hf": round(median["hf_train"])},
        **decoding,
        "generated_tokens": lengths,
        "train_ratio": round(median["ours_train"] / median["hf_train"], 2),
        **{f"{name}_ratio_{side}": round(median[f"{side}_{name}"] / median[f"hf_{name}"], 2)
           for name in ("beam5", "greedy") for side, _, _ in sides if side != "hf"},
        "rounds": args.rounds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
