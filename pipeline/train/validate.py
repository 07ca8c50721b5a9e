"""Validation on every rank: loss over all of the split, BLEU and chrF of beam search with decoding split across
ranks, asking about preemption between decoding chunks so that a notice never waits for a long validation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from model import Transformer, label_smoothed_cross_entropy

from ..config import TrainConfig
from ..data.manifest import Manifest
from ..text.metrics import score
from ..text.tokenizer import Tokenizer
from ..text.translator import translate_ids
from .shard import COLUMNS, TokenShard
from .workers import WorkerContext, all_gather_objects, all_reduce_

DECODE_CHUNK = 256  # sentences a rank decodes between two questions about preemption


class Preempted(Exception):
    """A preemption notice came while validating: the checkpoint must come first."""

    def __init__(self, notice):
        super().__init__("preemption notice during validation")
        self.notice = notice


def _chunks(items: list[int], share: int) -> list[list[int]]:
    """items in DECODE_CHUNK pieces, as many on every rank (share: the largest rank's item count)."""
    return [items[k * DECODE_CHUNK:(k + 1) * DECODE_CHUNK] for k in range(max(1, math.ceil(share / DECODE_CHUNK)))]


@torch.no_grad()
def validate(model: Transformer, val: TokenShard, refs: Sequence[str], tokenizer: Tokenizer, cfg: TrainConfig,
             ctx: WorkerContext, notice: Callable[[], object] | None = None) -> dict[str, float]:
    """Validation metrics, the same on every rank; notice() is asked between decoding chunks (Preempted on one)."""
    started = time.perf_counter()
    model.eval()
    rank, size = ctx.world_rank, ctx.world_size
    mine = list(range(rank, len(val), size))
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss, nll, tokens
    for start in range(0, len(mine), 64):
        chunk = mine[start: start + 64]
        src, tgt_in, tgt_out = (t.to(ctx.device) for t in val.collate(chunk))
        loss, nll, count = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, cfg.label_smoothing,
                                                        model.cfg.pad_id)
        sums += torch.stack([loss.double(), nll.double(), count.double()])
    loss_sum, nll_sum, tokens = all_reduce_(sums).tolist()
    hyps: list[list[int]] = []
    for chunk in _chunks(mine, math.ceil(len(val) / size)):
        hyps += translate_ids(model, [val.src.ids(i) for i in chunk], beam_size=cfg.val_beam_size or cfg.beam_size,
                              alpha=cfg.length_penalty)
        if notice is not None and (found := notice()) is not None:  # every rank asks after each chunk
            raise Preempted(found)
    texts = dict(zip(mine, tokenizer.decode_tgt(hyps)))
    for part in all_gather_objects(texts):
        texts.update(part)
    scores = score([texts[i] for i in range(len(refs))], list(refs))
    # DDP keeps replicas identical; if they ever differ, every later number is meaningless.
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    checksums = all_gather_objects(checksum)
    if max(checksums) != min(checksums):
        raise RuntimeError(f"data-parallel ranks diverged: parameter checksums {checksums}")
    return {"param_checksum": checksum, "val_loss": loss_sum / max(tokens, 1), "val_nll": nll_sum / max(tokens, 1),
            "val_bleu": scores["bleu"], "val_chrf": scores["chrf"], "val_seconds": time.perf_counter() - started}


class Validator:
    """The validation split, read once, scored on demand; notice() is asked between decoding chunks when the run
    checks for preemption."""

    def __init__(self, manifest: Manifest, tokenizer: Tokenizer, cfg: TrainConfig, ctx: WorkerContext,
                 notice: Callable[[], object]):
        split = manifest.read_split("validation", [*COLUMNS, "tgt"])
        self.val, self.refs = TokenShard.from_batches([split]), split.column("tgt").to_pylist()
        self.tokenizer, self.cfg, self.ctx = tokenizer, cfg, ctx
        self.notice = notice if cfg.preemption_check_s else None

    def score(self, model: Transformer, ask: bool = True) -> dict[str, float]:
        """validate() of the model (ask=False: no questions, e.g. at the run's end, where nothing is held)."""
        return validate(model, self.val, self.refs, self.tokenizer, self.cfg, self.ctx,
                        notice=self.notice if ask else None)
