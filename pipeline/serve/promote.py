"""`nmt promote`: the promoting login's own check of every candidate, then the champion decision.

A candidate is a run whose login could not register its model (registry.mark_candidate); nothing it
claims is trusted. Its model is the one that run logged, whatever its tags name; its score is the
validation BLEU this process computes on prepared data the promoter chose; and the version registered
is a copy logged into a run of the promoter's own, which no member can change afterwards. Each
candidate gets one verdict, recorded on that run (registered, or rejected and why), so a bad
candidate is reported once and never blocks the next promote.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..common import log
from ..common.errors import UserError
from ..config import experiment_name
from ..data.manifest import load_manifest
from ..text.metrics import score_with_signatures
from ..track import registry, reports, tracking
from ..track.target import TrackingTarget, mlflow_client
from .commands import translate

logger = log.get("promote")
CANDIDATE_RUN_TAG = "nmt.candidate_run"  # on a promotion run: the candidate run it judged
VERDICT_TAG = "nmt.verdict"  # on a promotion run: "registered version N" or "rejected: why"
SPLIT = "validation"


@dataclass(frozen=True)
class Verdict:
    """What the promoter decided about one candidate run."""

    run_id: str
    user: str
    version: str | None  # the version registered from it; None: rejected
    val_bleu: float | None  # as scored here
    claimed: str  # the val_bleu its run reported ("" when none could be read)
    reason: str = ""  # why it was rejected

    def line(self, name: str) -> str:
        """One line for the promoter."""
        who = f"candidate run {self.run_id} by {self.user or 'an unknown user'}"
        if self.version is None:
            return f"{who}: rejected: {self.reason}"
        claimed = f" (it reported {self.claimed})" if self.claimed else ""
        return f"{who}: val_bleu {self.val_bleu:.2f} here{claimed}: registered as {name} version {self.version}"


class Rejected(Exception):
    """A candidate that cannot be registered: its reason is reported, and the next candidate is judged."""


def validation_pairs(data_path: str) -> tuple[list[str], list[str]]:
    """(sources, references) of the validation split of a prepared dataset the promoter trusts."""
    try:
        table = load_manifest(data_path).read_split(SPLIT, ["src", "tgt"])
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"cannot read the {SPLIT} split of {data_path}: {tracking.error_line(err)}; candidates "
                        f"are scored on prepared data you trust: pass --data DIR from `nmt prepare`, or the "
                        f"--config and --set data.* the team prepared with") from None
    sources, references = table.column("src").to_pylist(), table.column("tgt").to_pylist()
    if not sources:
        raise UserError(f"the {SPLIT} split of {data_path} is empty: nothing to score candidates on")
    return sources, references


def promote_candidates(target: TrackingTarget, name: str, data_path: str, experiment: str = "",
                       device: str = "auto") -> Iterator[Verdict]:
    """Judge every candidate of `name` not judged yet, oldest first: each verdict as it is reached."""
    uri, client = target.uri, mlflow_client(target.uri)
    experiment = experiment_name(experiment, target.username)
    judged = _judged(client, experiment)
    pending = [run for run in registry.candidate_runs(uri, name) if run.info.run_id not in judged]
    if not pending:
        return
    sources, references = validation_pairs(data_path)
    logger.info(f"{len(pending)} candidate run(s) of {name} to score on {len(sources):,} {SPLIT} pairs of "
                f"{data_path}")
    for run in pending:
        yield _judge(target, experiment, name, run, data_path, sources, references, device)


def _judged(client, experiment: str) -> set[str]:
    """The candidate runs this promoting login has already given a verdict (runs of its own experiment)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return set()
    runs = client.search_runs([found.experiment_id], f"tags.`{CANDIDATE_RUN_TAG}` != ''", max_results=50000)
    return {run.data.tags[CANDIDATE_RUN_TAG] for run in runs if run.data.tags.get(VERDICT_TAG)}


def _judge(target: TrackingTarget, experiment: str, name: str, run, data_path: str, sources: list[str],
           references: list[str], device: str) -> Verdict:
    """Score one candidate's own model here and register a copy of it, or reject it; either way recorded."""
    run_id, user = run.info.run_id, run.data.tags.get("mlflow.user") or run.info.user_id or ""
    claimed = _claimed_bleu(run)
    tags = {CANDIDATE_RUN_TAG: run_id, "candidate_user": user, "claimed_val_bleu": claimed, "nmt.kind": "promotion"}
    with tracking.mlflow_run(target.uri, experiment, f"promote-{name}-{run_id[:8]}", {"evaluated_on": data_path},
                             tags, source="nmt promote", user=target.username) as promotion:
        try:
            translator = registry.load_translator(target.uri, _own_model(target.uri, run), device)
            hypotheses = translate(functools.partial(translator.translate, truncate=True), sources,
                                   translator.beam_size, progress=True)
            scores = score_with_signatures(hypotheses, references)
        except (Rejected, UserError) as err:
            verdict = Verdict(run_id, user, None, None, claimed, str(err))
            promotion.end_tags[VERDICT_TAG] = f"rejected: {verdict.reason}"[:5000]
            return verdict
        bleu = float(scores["bleu"])
        reports.log_metrics(promotion, {"val_bleu": bleu, "val_chrf": float(scores["chrf"])})
        info = registry.log_model(promotion, translator, sources[0])
        version_tags = {"val_bleu": f"{bleu:.4f}", "run_id": promotion.id, "candidate_run_id": run_id,
                        "candidate_user": user, "claimed_val_bleu": claimed, "data_path": data_path,
                        "evaluated_on": f"{data_path} {SPLIT} ({len(sources):,} pairs)",
                        "beam_size": str(translator.beam_size), "length_penalty": str(translator.alpha)}
        version = registry.create_version(target.uri, name, info.model_uri, info.model_id, promotion.id,
                                          version_tags)
        promotion.end_tags[VERDICT_TAG] = f"registered version {version}"
    return Verdict(run_id, user, version, bleu, claimed)


def _claimed_bleu(run) -> str:
    """The val_bleu the candidate's run reported, as text (for the record only; never used to decide)."""
    value = run.data.metrics.get("val_bleu")
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:.2f}" if abs(value) < 1e6 else f"{value:.3g}"


def _own_model(uri: str, run) -> str:
    """The URI of the model the candidate run itself logged; Rejected when it has none, or its tag names another."""
    client = mlflow_client(uri)
    run_id, named = run.info.run_id, _named_model(run)
    models = client.search_logged_models([run.info.experiment_id], f"source_run_id = '{run_id}'")
    if named and named not in {m.model_id for m in models}:
        raise Rejected(f"its candidate tag names model {named}, which run {run_id} did not log")
    if not models:
        raise Rejected(f"run {run_id} logged no model of its own")
    chosen = next((m for m in models if m.model_id == named), None) or max(models, key=lambda m: m.creation_timestamp)
    return chosen.model_uri


def _named_model(run) -> str:
    """The model id the run's candidate tag names ("" when the tag is missing or unreadable)."""
    try:
        found: Any = json.loads(run.data.tags.get(registry.CANDIDATE_MODEL_TAG, "{}"))
        return str(found.get("model_id") or "") if isinstance(found, dict) else ""
    except ValueError:
        return ""
