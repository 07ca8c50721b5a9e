"""Scoring with sacreBLEU and batched translation of token ids (shared by training and `nmt evaluate`)."""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu
import torch

from model import Transformer, beam_search, greedy_search

from .batching import PAD_ID
from .errors import UserError


def check_counts(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """sacreBLEU's Python API silently truncates to the shorter list: refuse a mismatch instead."""
    if len(hypotheses) != len(references):
        raise UserError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must pair line by line"
        )


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Cased, detokenized BLEU and chrF (sacreBLEU defaults), the metrics reported while training."""
    check_counts(hypotheses, references)
    refs = [list(references)]
    return {
        "bleu": sacrebleu.corpus_bleu(list(hypotheses), refs).score,
        "chrf": sacrebleu.corpus_chrf(list(hypotheses), refs).score,
    }


def score_with_signatures(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, object]:
    """BLEU and chrF with their signatures, plus lowercased 13a BLEU as published Multi30k work reports."""
    check_counts(hypotheses, references)
    refs = [list(references)]
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    lower = sacrebleu.BLEU(lowercase=True, tokenize="13a")
    results = {
        "bleu": bleu.corpus_score(list(hypotheses), refs),
        "chrf": chrf.corpus_score(list(hypotheses), refs),
        "bleu_lc": lower.corpus_score(list(hypotheses), refs),
    }
    return {
        "bleu": results["bleu"].score, "chrf": results["chrf"].score, "bleu_lc": results["bleu_lc"].score,
        "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
        "bleu_lc_signature": str(lower.get_signature()),
    }


@torch.no_grad()
def translate_ids(model: Transformer, sources: Sequence[Sequence[int]], beam_size: int = 4,
                  alpha: float = 0.6, max_tokens: int = 8000, max_len: int | None = None) -> list[list[int]]:
    """Decode source id lists in length-sorted batches of about max_tokens source tokens; input order kept."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    # An empty source has nothing to attend to (its softmax would be all -inf): it translates to nothing.
    order = sorted((i for i in range(len(sources)) if len(sources[i])), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    start = 0
    while start < len(order):
        longest = max(1, len(sources[order[start]]))
        end = start + 1
        while end < len(order) and (end - start + 1) * max(longest, len(sources[order[end]])) <= max_tokens:
            longest = max(longest, len(sources[order[end]]))
            end += 1
        chunk = order[start:end]
        width = max(1, max(len(sources[i]) for i in chunk))
        src = torch.full((len(chunk), width), PAD_ID, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.as_tensor(list(sources[i]), dtype=torch.long)
        src = src.to(device)
        if beam_size == 1:
            hyps = greedy_search(model, src, max_len=max_len)
        else:
            hyps = beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=max_len)
        for i, hyp in zip(chunk, hyps):
            outputs[i] = hyp
        start = end
    model.train(was_training)
    return outputs
