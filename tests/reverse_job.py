"""The work of the sequence-reversal test (tests/test_reversal.py), run by the background lane as an idle job:
800 updates of a small Transformer on random sequences, then exact match on 200 held-out ones.

    python tests/reverse_job.py SEED OUT_JSON

It lowers its priority at once (tests/idle.py) and trains on one thread; OUT_JSON gets {"exact_match": ...}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from idle import lower_to_idle  # noqa: E402

from model import (  # noqa: E402
    Transformer,
    TransformerConfig,
    greedy_search,
    label_smoothed_cross_entropy,
    warmup_schedule,
)

PAD, BOS, EOS = 0, 2, 3
# Seeds spread more than CPUs do: `python benchmarks/reverse_seeds.py` (one thread, as here) gave 0.935 to
# 1.0 over seeds 0-7 on a 2-core machine of this project's kind (seed 0, the test's: 0.955; on two threads
# 0.94 to 1.0, and 0.985 for seed 0 on a host with AMX). The floor sits under the lowest seed; an untrained
# model scores 0.
REVERSE_FLOOR = 0.90


def reverse_batch(gen: torch.Generator, batch: int, vocab: int):
    """Random sequences of 3..8 symbols and their reversal, as padded src / tgt_in / tgt_out."""
    lengths = torch.randint(3, 9, (batch,), generator=gen)
    src = torch.full((batch, 10), PAD)
    tgt = torch.full((batch, 12), PAD)
    for i, n in enumerate(lengths.tolist()):
        seq = torch.randint(4, vocab, (n,), generator=gen)
        src[i, :n] = seq
        tgt[i, 0], tgt[i, 1: n + 1], tgt[i, n + 1] = BOS, seq.flip(0), EOS
    return src, tgt[:, :-1], tgt[:, 1:]


def reverse_exact_match(seed: int) -> float:
    """Exact match on 200 held-out sequences after 800 updates of a small Transformer (seeded by `seed`)."""
    torch.manual_seed(seed)
    vocab = 36
    cfg = TransformerConfig.preset("tiny", vocab_size=vocab, d_model=64, d_ff=128, num_heads=4,
                                   num_layers=2, dropout=0.0, label_smoothing=0.0)
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    scheduler = warmup_schedule(optimizer, cfg.d_model, warmup_steps=50, scale=0.25)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(800):
        src, tgt_in, tgt_out = reverse_batch(gen, 64, vocab)
        loss, _, count = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, 0.0, PAD)
        optimizer.zero_grad()
        (loss / count).backward()
        optimizer.step()
        scheduler.step()
    model.eval()
    src, tgt_in, tgt_out = reverse_batch(torch.Generator().manual_seed(99), 200, vocab)
    hypotheses = greedy_search(model, src)
    references = [[t for t in row if t not in (PAD, EOS)] for row in tgt_out.tolist()]
    return sum(h == r for h, r in zip(hypotheses, references)) / len(references)


def main() -> None:
    seed, out = int(sys.argv[1]), Path(sys.argv[2])
    lower_to_idle()
    torch.set_num_threads(1)
    result = {"seed": seed, "exact_match": reverse_exact_match(seed)}
    part = out.with_name(out.name + ".part")
    part.write_text(json.dumps(result))
    os.replace(part, out)


if __name__ == "__main__":
    main()
