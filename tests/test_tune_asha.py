"""ASHA in a real sweep: early stops, MLflow parent/child runs, the best trial registered as champion."""

import math

import pytest
from mlflow.tracking import MlflowClient
from small import small_config

from pipeline.tune.sweep import sweep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_sweep_stops_trials_early_tracks_parent_and_children_and_registers_the_best(ray_session, tmp_path):
    # Tune's grid order varies the alphabetically first key fastest: a good learning rate runs
    # first, so ASHA has a rung value to compare each hopeless one against.
    (tmp_path / "space.yaml").write_text("train.lr_scale: {grid: [2.0, 0.005]}\n"
                                         "train.warmup_steps: {grid: [50, 100]}\n")
    cfg = small_config(tmp_path, "train.num_workers=1", "train.max_steps=160", "train.val_interval=40",
                       "train.epochs=100", "tune.grace_period=120", "tune.reduction_factor=2", "tune.search=grid",
                       "tune.name=sweep-test", "tracking.experiment=tune-tests")
    outcome = sweep(cfg, str(tmp_path / "space.yaml"))
    by_status = {}
    for trial in outcome.trials:
        by_status.setdefault(trial["status"], []).append(trial)
    assert len(outcome.trials) == 4 and not by_status.get("REJECTED")
    assert by_status.get("STOPPED_EARLY"), [(t["params"], t["status"], t["steps"]) for t in outcome.trials]
    assert all(t["steps"] < 160 for t in by_status["STOPPED_EARLY"])
    # The champion is the trial with the best val_bleu.
    valid = [t for t in outcome.trials if not math.isnan(t["val_bleu"]) and t["checkpoint_path"]]
    best = max(valid, key=lambda t: t["val_bleu"])
    assert outcome.best is best and best["params"]["train.lr_scale"] == 2.0 and best["val_bleu"] > 0
    client = MlflowClient(cfg.tracking.tracking_uri)
    champion = client.get_model_version_by_alias(cfg.tracking.registered_model, "champion")
    assert champion.run_id == best["run_id"]
    # MLflow: one parent, one child per trial, nothing duplicated.
    experiment = client.get_experiment_by_name("tune-tests")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("nmt.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == outcome.parent_run_id]
    assert len(parents) == 1 and len(children) == 4 and len(runs) == 5
    assert {r.data.tags["nmt.trial_id"] for r in children} == {t["trial_id"] for t in outcome.trials}
    artifacts = {a.path for a in client.list_artifacts(outcome.parent_run_id)}
    assert {"trials.csv", "best_config.yaml", "space.yaml", "val_bleu_vs_train_lr_scale.png"} <= artifacts
    assert client.get_run(best["run_id"]).data.metrics["val_bleu"] > 0
