"""Scoring with sacreBLEU: the metrics of training, `nmt evaluate` and the benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu

from ..common.errors import UserError


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
