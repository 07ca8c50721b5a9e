"""ASHA in a real sweep, logged through an MLflow server that requires a login: early stops, MLflow
parent/child runs, the best trial registered as champion, and trials that log with the driver's login."""

import logging
import math
import types

import pytest
from conftest import environment
from mlflow.tracking import MlflowClient
from small import small_config

from pipeline.tune.sweep import sweep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def asha_sweep(ray_session, mlflow_auth_server, tmp_path_factory):
    """One sweep of four trials against the basic-auth server, the `trainer` login in the driver's environment only."""
    tmp_path = tmp_path_factory.mktemp("asha")
    # Tune's grid order varies the alphabetically first key fastest: a good learning rate runs
    # first, so ASHA has a rung value to compare each hopeless one against.
    (tmp_path / "space.yaml").write_text("train.lr_scale: {grid: [2.0, 0.005]}\n"
                                         "train.warmup_steps: {grid: [50, 100]}\n")
    cfg = small_config(tmp_path, "train.num_workers=1", "train.max_steps=160", "train.val_interval=40",
                       "train.epochs=100", "tune.grace_period=120", "tune.reduction_factor=2", "tune.search=grid",
                       "tune.name=sweep-test", "tracking.experiment=tune-tests",
                       "tracking.registered_model=tune-tests", tracking_uri=mlflow_auth_server.uri)
    login = {"MLFLOW_TRACKING_USERNAME": mlflow_auth_server.user,
             "MLFLOW_TRACKING_PASSWORD": mlflow_auth_server.password}
    # A login never makes a registered model on a server with logins: the admin makes it and lets this one manage
    # it, as a team's promoting login does (deploy/mlflow_users.py promoter ... --model).
    from mlflow_users import team_model

    with environment(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=mlflow_auth_server.admin_password):
        team_model(mlflow_auth_server.uri, "tune-tests", mlflow_auth_server.user)
    lines = []  # what the sweep logs: one line per trial start and end
    collect = logging.Handler()
    collect.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("pipeline").addHandler(collect)
    try:
        with environment(**login):
            outcome = sweep(cfg, str(tmp_path / "space.yaml"))
    finally:
        logging.getLogger("pipeline").removeHandler(collect)
    return types.SimpleNamespace(cfg=cfg, outcome=outcome, login=login, uri=mlflow_auth_server.uri, lines=lines)


def _runs(asha_sweep):
    with environment(**asha_sweep.login):
        client = MlflowClient(asha_sweep.uri)
        return client, client.search_runs([client.get_experiment_by_name("tune-tests").experiment_id])


def test_sweep_stops_trials_early_tracks_parent_and_children_and_registers_the_best(asha_sweep):
    cfg, outcome = asha_sweep.cfg, asha_sweep.outcome
    by_status = {}
    for trial in outcome.trials:
        by_status.setdefault(trial["status"], []).append(trial)
    assert len(outcome.trials) == 4 and not by_status.get("REJECTED")
    assert by_status.get("STOPPED_EARLY"), [(t["params"], t["status"], t["steps"]) for t in outcome.trials]
    assert all(t["steps"] < 160 for t in by_status["STOPPED_EARLY"])
    # The sweep says so as it goes, one line per trial start and end, in place of Tune's status tables.
    for trial in outcome.trials:
        assert f"trial {trial['trial_id']} started: lr_scale " in "\n".join(asha_sweep.lines)
        early = " (stopped early)" if trial["status"] == "STOPPED_EARLY" else ""
        assert any(line.startswith(f"trial {trial['trial_id']} ended at update {trial['steps']}{early}: val_bleu ")
                   for line in asha_sweep.lines), asha_sweep.lines
    # The champion is the trial with the best val_bleu.
    valid = [t for t in outcome.trials if not math.isnan(t["val_bleu"]) and t["checkpoint_path"]]
    best = max(valid, key=lambda t: t["val_bleu"])
    assert outcome.best is best and best["params"]["train.lr_scale"] == 2.0 and best["val_bleu"] > 0
    client, runs = _runs(asha_sweep)
    with environment(**asha_sweep.login):
        champion = client.get_model_version_by_alias(cfg.tracking.registered_model, "champion")
        artifacts = {a.path for a in client.list_artifacts(outcome.parent_run_id)}
        best_run = client.get_run(best["run_id"])
    assert champion.run_id == best["run_id"]
    # MLflow: one parent, one child per trial, nothing duplicated.
    parents = [r for r in runs if r.data.tags.get("nmt.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == outcome.parent_run_id]
    assert len(parents) == 1 and len(children) == 4 and len(runs) == 5
    assert {r.data.tags["nmt.trial_id"] for r in children} == {t["trial_id"] for t in outcome.trials}
    assert {"trials.csv", "best_config.yaml", "space.yaml", "val_bleu_vs_train_lr_scale.png"} <= artifacts
    # The best validation, not the last one, which can fall back to 0 after a good one in so short a sweep.
    assert best_run.data.metrics["best_val_bleu"] == pytest.approx(best["val_bleu"]) and best["val_bleu"] > 0


def test_a_sweep_logs_and_registers_with_credentials_from_the_environment(asha_sweep):
    outcome = asha_sweep.outcome
    client, runs = _runs(asha_sweep)
    with environment(**asha_sweep.login):
        versions = client.search_model_versions(f"name = '{asha_sweep.cfg.tracking.registered_model}'")
    assert outcome.registered is not None and any(v.version == outcome.registered.version for v in versions)
    # Every trial ends FINISHED (a stop by ASHA is no failure), those ASHA stopped tagged once the sweep is over,
    # and each with its best validation as a metric, the figure the runs table compares.
    stopped = {t["run_id"] for t in outcome.trials if t["status"] == "STOPPED_EARLY"}
    assert {r.info.run_id for r in runs if r.data.tags.get("stopped_early") == "asha"} == stopped
    assert {r.info.status for r in runs} == {"FINISHED"}
    by_id = {r.info.run_id: r for r in runs}
    for trial in outcome.trials:
        if trial["run_id"] and trial["val_bleu"] == trial["val_bleu"]:
            assert by_id[trial["run_id"]].data.metrics["best_val_bleu"] == pytest.approx(trial["val_bleu"])
    # Trials and Ray Train's controllers are actors of a Ray instance started without the login: they logged too.
    trials = [r for r in runs if r.info.run_id != outcome.parent_run_id]
    assert all({"train_loss", "val_bleu"} <= set(r.data.metrics) for r in trials)
    # Each trial shows its source and the data it trained on, as its parent does.
    assert {r.data.tags["mlflow.source.name"] for r in trials} == {"nmt tune (trial)"}
    assert all({i.tags[0].value for i in r.inputs.dataset_inputs} == {"train", "validation", "test"} for r in runs)
