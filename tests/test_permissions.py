"""A team's tracking server on PostgreSQL: a login per person, a read-only login for serving, and a promoting
login that alone registers versions of the team's model and moves its @champion (deploy/mlflow_users.py).

alice trains into the team's model: her login may not register, so her run becomes a candidate, which the
promoter registers and crowns with `nmt promote`. bob (another person) and serving only read.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import TEAM_MODEL, environment
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from small import ROOT, small_config

from pipeline.common.errors import UserError
from pipeline.track import champion, registry, tracking

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def login(server, name: str) -> dict[str, str | None]:
    """MLflow's login variables for one of the server's users."""
    return {"MLFLOW_TRACKING_USERNAME": name, "MLFLOW_TRACKING_PASSWORD": server.logins[name],
            "MLFLOW_TRACKING_TOKEN": None, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


def nmt(server, name: str, *args: str) -> subprocess.CompletedProcess:
    """An `nmt` command run with one user's login."""
    env = {**os.environ, **{k: v for k, v in login(server, name).items() if v is not None}}
    return subprocess.run([sys.executable, "-m", "pipeline", *args, "--set", f"tracking.tracking_uri={server.uri}"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.fixture(scope="module")
def team(ray_session, mlflow_auth_server, tmp_path_factory):
    """alice's training run into the team's model, then `nmt promote` with the promoting login."""
    import types

    server = mlflow_auth_server
    # A short run: what matters is where its model goes, not how good it is.
    cfg = small_config(tmp_path_factory.mktemp("alice"), "train.max_steps=30", "train.val_interval=30",
                       "train.epochs=100", "train.beam_size=1", "train.average_last=1",
                       "tracking.experiment=alice-multi30k", f"tracking.registered_model={TEAM_MODEL}",
                       "tracking.system_metrics_s=0", tracking_uri=server.uri)
    from pipeline.train.driver import train

    with environment(**login(server, "alice")):
        outcome = train(cfg)
    from pipeline.data.prepare import prepared_path

    data = prepared_path(cfg.data)[0]  # the validation split the promoter scores candidates on
    promoted = nmt(server, "promoter", "promote", "--name", TEAM_MODEL, "--data", data)
    return types.SimpleNamespace(server=server, outcome=outcome, promoted=promoted, cfg=cfg, data=data)


def test_a_persons_run_is_a_candidate_that_the_promoting_login_registers_and_crowns(team):
    server, outcome = team.server, team.outcome
    assert outcome.registered is None  # alice may not add versions of the team's model
    with environment(**login(server, "alice")):
        run = MlflowClient(server.uri).get_run(outcome.run_id)
    assert run.data.tags[registry.CANDIDATE_TAG] == TEAM_MODEL and run.data.tags["mlflow.user"] == "alice"
    assert team.promoted.returncode == 0, team.promoted.stderr[-2000:]
    assert f"candidate run {outcome.run_id} by alice: val_bleu " in team.promoted.stdout
    assert f"registered as {TEAM_MODEL} version 1" in team.promoted.stdout, team.promoted.stdout
    with environment(**login(server, "bob")):  # anyone reads the result
        client = MlflowClient(server.uri, registry_uri=server.uri)
        version = client.get_model_version_by_alias(TEAM_MODEL, champion.CHAMPION)
        copy = client.get_run(version.run_id)
    # The version is the promoter's copy of alice's model, in a run of the promoter's: alice cannot change it.
    assert version.version == "1" and version.tags["candidate_run_id"] == outcome.run_id
    assert copy.data.tags["mlflow.user"] == "promoter" and version.run_id != outcome.run_id
    # Its val_bleu is the promoter's own evaluation on the same validation split, not the figure alice's run logged.
    assert float(version.tags["val_bleu"]) == pytest.approx(outcome.metrics["val_bleu"], abs=1.0)
    assert version.tags["claimed_val_bleu"] == f"{outcome.metrics['val_bleu']:.2f}"
    again = nmt(server, "promoter", "promote", "--name", TEAM_MODEL, "--data", team.data)  # judged once
    assert again.returncode == 0 and "candidate run" not in again.stdout, again.stderr[-2000:]


def test_forged_and_malformed_candidates_are_reported_skipped_and_never_crowned(team):
    """bob marks two runs of his candidates with a val_bleu of 1e308: one names alice's model (his run logged none),
    one carries a copy of her model under a tag that is not JSON. The promoter rejects the first, scores the second
    as what it is (her model's BLEU, which does not beat her version), and the next promote judges neither again."""
    import json

    from pipeline.track.tracking import Run

    server, outcome = team.server, team.outcome
    with environment(**login(server, "promoter")):
        alice_model = MlflowClient(server.uri, registry_uri=server.uri).get_model_version(TEAM_MODEL, "1")
    with environment(**login(server, "bob")):
        client = MlflowClient(server.uri)
        experiment = client.create_experiment("bobs-claims")
        alice_own = client.search_logged_models([client.get_run(outcome.run_id).info.experiment_id])[0]
        forged = client.create_run(experiment, run_name="forged", tags={"mlflow.user": "bob"})
        client.log_metric(forged.info.run_id, "val_bleu", 1e308)
        client.set_tag(forged.info.run_id, registry.CANDIDATE_MODEL_TAG, json.dumps(
            {"model_uri": alice_own.model_uri, "model_id": alice_own.model_id, "tags": {"val_bleu": "1e308"}}))
        client.set_tag(forged.info.run_id, registry.CANDIDATE_TAG, TEAM_MODEL)
        copied = client.create_run(experiment, run_name="copied", tags={"mlflow.user": "bob"})
        translator = registry.load_translator(server.uri, f"models:/{TEAM_MODEL}/1", "cpu")
        registry.log_model(Run(server.uri, copied.info.run_id), translator, "a small dog runs .")
        client.log_metric(copied.info.run_id, "val_bleu", 1e308)
        client.set_tag(copied.info.run_id, registry.CANDIDATE_MODEL_TAG, "{not json")
        client.set_tag(copied.info.run_id, registry.CANDIDATE_TAG, TEAM_MODEL)
    promoted = nmt(server, "promoter", "promote", "--name", TEAM_MODEL, "--data", team.data)
    assert promoted.returncode == 0 and "Traceback" not in promoted.stderr, promoted.stderr[-3000:]
    assert f"candidate run {forged.info.run_id} by bob: rejected: its candidate tag names model " \
           f"{alice_own.model_id}, which run {forged.info.run_id} did not log" in promoted.stdout, promoted.stdout
    assert f"candidate run {copied.info.run_id} by bob: val_bleu " in promoted.stdout, promoted.stdout
    with environment(**login(server, "bob")):
        client = MlflowClient(server.uri, registry_uri=server.uri)
        versions = {v.tags.get("candidate_run_id"): v for v in client.search_model_versions(f"name = '{TEAM_MODEL}'")}
        assert forged.info.run_id not in versions
        copy = versions[copied.info.run_id]
        assert float(copy.tags["val_bleu"]) == pytest.approx(float(alice_model.tags["val_bleu"]), abs=0.01)
        assert client.get_model_version_by_alias(TEAM_MODEL, champion.CHAMPION).version == "1"  # a tie moves nothing
    again = nmt(server, "promoter", "promote", "--name", TEAM_MODEL, "--data", team.data)
    assert again.returncode == 0 and "candidate run" not in again.stdout, again.stderr[-2000:]


def test_a_read_permission_cannot_register_move_the_alias_or_write_to_anothers_experiment(team):
    server, outcome = team.server, team.outcome
    with environment(**login(server, "bob")):
        client = MlflowClient(server.uri, registry_uri=server.uri)
        for attempt in (lambda: client.create_model_version(TEAM_MODEL, f"runs:/{outcome.run_id}/model",
                                                            run_id=outcome.run_id),
                        lambda: client.set_registered_model_alias(TEAM_MODEL, champion.CHAMPION, "1"),
                        lambda: client.log_metric(outcome.run_id, "val_bleu", 99.0)):
            with pytest.raises(MlflowException) as refused:
                attempt()
            assert refused.value.get_http_status_code() == 403
        # The pipeline's own calls say what was refused and what to do, in one line.
        with pytest.raises(UserError, match=r"refused writing run 'bobs-run' in experiment 'alice-multi30k' "
                                            r"\(HTTP 403\): MLflow user 'bob' may not do it"):
            tracking.open_run(server.uri, "alice-multi30k", "bobs-run", {}, {}, user="bob")
    moved = nmt(server, "bob", "promote", "1", "--name", TEAM_MODEL)
    assert moved.returncode == 2 and "(HTTP 403): MLflow user 'bob' may not change the registered model" in \
        moved.stderr and "Traceback" not in moved.stderr, moved.stderr[-2000:]
    with environment(**login(server, "bob")):
        assert MlflowClient(server.uri, registry_uri=server.uri).get_model_version_by_alias(
            TEAM_MODEL, champion.CHAMPION).version == "1"  # nothing moved


def test_serving_works_with_the_read_only_login_and_can_change_nothing(team):
    from pipeline.config import load_config
    from pipeline.serve.app import app_for
    from pipeline.serve.commands import load_engine

    server = team.server
    with environment(**login(server, "serving")):
        cfg = load_config(ROOT / "configs" / "demo.yaml", [f"tracking.registered_model={TEAM_MODEL}"])
        app_for(cfg.serve, server.uri, TEAM_MODEL)  # what the RayService's build_app runs: resolves @champion
        engine = load_engine(server.uri, f"models:/{TEAM_MODEL}@{champion.CHAMPION}", "pytorch", "cpu", "/tmp")
        assert len(engine.translate(["a small dog runs ."], None)) == 1
        with pytest.raises(UserError, match="may not change the registered model"):
            with registry.refused_as_user_error(server.uri, "promoting", "serving"):
                champion.promote(server.uri, TEAM_MODEL, "1")


def test_the_team_servers_runs_users_and_models_are_kept_in_postgresql(team, postgres):
    with postgres.connect("mlflow_team") as conn:
        runs = conn.execute("SELECT count(*) FROM runs WHERE run_uuid = %s", (team.outcome.run_id,)).fetchone()[0]
        models = conn.execute("SELECT count(*) FROM model_versions WHERE name = %s", (TEAM_MODEL,)).fetchone()[0]
    with postgres.connect("mlflow_team_auth") as conn:
        users = {row[0] for row in conn.execute("SELECT username FROM users")}
    assert runs == 1 and models >= 1
    assert {"admin", "alice", "bob", "serving", "promoter"} <= users
