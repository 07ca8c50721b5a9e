"""MetricLogger: progress values carried by a report land at their own steps and times; the last report waits.
Runs carry MLflow's standard tags, and their data as dataset inputs. A tracking URI's login is moved into
MLflow's variables and hidden wherever a URI is shown."""

from __future__ import annotations

import contextlib
import logging
import os
import time

import pytest
from conftest import environment, free_port
from mlflow.tracking import MlflowClient
from stores import sqlite_uri

from pipeline.common.messages import EARLIER_KEY, FINAL_KEY, Report
from pipeline.track import login, provenance, reports, target, tracking


def test_a_report_logs_its_earlier_progress_values_at_their_own_steps_and_times(tmp_path):
    uri = sqlite_uri(tmp_path)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("paced")).info.run_id
    earlier = [{"step": s, "time": 1_700_000_000.0 + s, "train_loss": 10.0 - s, "lr": 0.1} for s in (5, 10, 15)]
    reports.MetricLogger(tracking.Run(uri, run_id)).log(Report(
        {"step": 20, "train_loss": 5.0, "val_bleu": 1.5, "param_checksum": 41.5, "averaged": 2}, tuple(earlier)))
    history = sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(5, 5.0), (10, 0.0), (15, -5.0), (20, 5.0)]
    assert [m.timestamp for m in history[:3]] == [1_700_000_005_000, 1_700_000_010_000, 1_700_000_015_000]
    # The averaged checkpoint's scores are charts of their own: a learning curve ends with the run's own model.
    assert not client.get_metric_history(run_id, "val_bleu")
    assert [m.step for m in client.get_metric_history(run_id, "val_bleu_averaged")] == [20]
    internal = {"time", "step", "param_checksum", "averaged", EARLIER_KEY, FINAL_KEY}
    assert not internal & set(client.get_run(run_id).data.metrics)  # no charts of the loop's own checks


def test_a_run_has_mlflow_standard_tags_and_its_datasets_once_however_often_they_are_logged(tmp_path):
    import getpass

    uri = sqlite_uri(tmp_path)
    first = tracking.open_run(uri, "tags", "run-a", {"train.epochs": 3}, {}, source="nmt train")
    again = tracking.open_run(uri, "tags", "run-a", {"train.epochs": 3}, {}, source="nmt train")  # a resume
    assert again == first
    run_id = first.id
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags["mlflow.source.name"] == "nmt train" and run.data.tags["mlflow.user"] == getpass.getuser()
    assert run.data.tags["mlflow.runName"] == "run-a" and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert run.data.tags.get("mlflow.source.git.commit", "unknown") == provenance.git_commit()
    datasets = [{"name": f"demo-en-de-0123/{split}", "digest": "0123456789abcdef", "source": f"s3://b/p/{split}",
                 "context": split, "profile": {"pairs": n}} for split, n in (("train", 30), ("validation", 5))]
    for _ in range(2):  # a resumed run logs them again
        first.log_datasets(datasets)
    inputs = MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    assert sorted((i.dataset.name, i.tags[0].value, i.dataset.digest, i.dataset.source_type) for i in inputs) == [
        ("demo-en-de-0123/train", "train", "0123456789abcdef", "s3"),
        ("demo-en-de-0123/validation", "validation", "0123456789abcdef", "s3")]


def test_datasets_another_run_inserted_at_the_same_moment_are_linked_not_a_failure(tmp_path, monkeypatch):
    """Two sweeps starting at once on one SQLite store: MLflow checks for the dataset, the other run inserts it,
    and this run's insert hits the unique constraint (seen in CI). The run logs them again and links them."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import BAD_REQUEST  # what the SQL store raises: a 400, not retried

    uri = sqlite_uri(tmp_path)
    run = tracking.open_run(uri, "race", "run-b", {}, {}, source="nmt tune")
    datasets = [{"name": "demo/train", "digest": "0123456789abcdef", "source": "/data/train", "context": "train",
                 "profile": {"pairs": 3}}]
    real, calls = MlflowClient.log_inputs, []

    def racing(self, run_id, datasets=None, models=None):
        calls.append(run_id)
        if len(calls) == 1:
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                  "datasets.name, datasets.digest", error_code=BAD_REQUEST)
        return real(self, run_id, datasets=datasets)

    monkeypatch.setattr(MlflowClient, "log_inputs", racing)
    run.log_datasets(datasets)
    assert len(calls) == 2
    assert [i.dataset.name for i in MlflowClient(uri).get_run(run.id).inputs.dataset_inputs] == ["demo/train"]
    calls.clear()
    monkeypatch.setattr(MlflowClient, "log_inputs", lambda *a, **k: (_ for _ in ()).throw(
        MlflowException("no such experiment", error_code=BAD_REQUEST)))
    with pytest.raises(MlflowException, match="no such experiment"):  # any other refusal is raised at once
        run.log_datasets(datasets)


def test_values_the_store_refuses_stay_queued_and_the_last_report_retries_then_says_what_was_lost(
        tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    metric_logger = reports.MetricLogger(tracking.Run(f"http://127.0.0.1:{free_port()}", "0" * 32))  # no one there
    metric_logger.FINAL_WAIT_S = 3.0
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        start = time.monotonic()
        metric_logger.log(Report({"step": 5, "train_loss": 1.0}))
        assert time.monotonic() - start < 2.5  # a report during training never waits for the store
        assert len(metric_logger.pending) == 1 and "training goes on" in caplog.text
        start = time.monotonic()
        metric_logger.log(Report({"step": 10, "train_loss": 0.5}, final=True))
        assert time.monotonic() - start >= 3.0  # the last one retried for FINAL_WAIT_S
    assert "did not answer within 3s after training: 2 metric values were not logged" in caplog.text


def test_a_run_made_by_mlflow_run_becomes_the_commands_run_keeping_its_source_tags(tmp_path, caplog):
    uri = sqlite_uri(tmp_path)
    client = MlflowClient(uri)
    made = client.create_run(client.create_experiment("project"), tags={
        "mlflow.source.name": "file:///repo", "mlflow.source.type": "PROJECT"}).info.run_id
    run_id = tracking.open_run(uri, "project", "train-1", {"model.d_model": 64}, {"data_manifest": "abc"},
                               source="nmt train", adopt_run_id=made).id
    run = client.get_run(run_id)
    assert run_id == made and run.data.params == {"model.d_model": "64"}
    assert run.data.tags["mlflow.source.name"] == "file:///repo"  # the maker's, not "nmt train"
    assert run.data.tags[tracking.RUN_NAME_TAG] == "train-1" and run.data.tags["data_manifest"] == "abc"
    # A run id of another store cannot be adopted: the command makes its own run and says so.
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        other = tracking.open_run(uri, "project", "train-2", {}, {}, adopt_run_id="0" * 32).id
    assert other not in (made, "0" * 32) and "MLFLOW_RUN_ID" in caplog.text
    assert client.get_run(other).data.tags["mlflow.source.name"] == "nmt"


@pytest.mark.parametrize(("raised", "status"), [
    (None, "FINISHED"), (RuntimeError("publishing failed"), "FAILED"), (KeyboardInterrupt(), "KILLED"),
    (SystemExit(0), "RUNNING"),  # Tune stopping a trial: the sweep's summary marks it
])
def test_a_run_ends_with_its_block_finished_with_its_tags_failed_killed_or_left_to_the_sweep(tmp_path, raised, status):
    uri = sqlite_uri(tmp_path)
    with pytest.raises(type(raised)) if raised else contextlib.nullcontext():
        with tracking.mlflow_run(uri, "ends", "run-a", {}, {}) as run:
            run.end_tags["best_val_bleu"] = "12.34"
            if raised:
                raise raised
    found = MlflowClient(uri).get_run(run.id)
    assert found.info.status == status
    assert ("best_val_bleu" in found.data.tags) == (status == "FINISHED")  # the last tags only on a normal end


def test_a_store_failing_as_the_run_ends_does_not_hide_the_error_that_ended_it(tmp_path, monkeypatch, caplog):
    def refuse(self, status="FINISHED", tags=None):
        raise OSError("the store is down")

    uri = sqlite_uri(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pipeline"), pytest.raises(RuntimeError, match="training failed"):
        with tracking.mlflow_run(uri, "ends", "run-b", {}, {}):
            monkeypatch.setattr(tracking.Run, "end", refuse)
            raise RuntimeError("training failed")
    assert "could not mark MLflow run" in caplog.text and "the store is down" in caplog.text


def test_an_sqlite_stores_artifacts_go_beside_it_wherever_the_command_runs(tmp_path, monkeypatch):
    store, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # `nmt demo --workdir work`, started from another directory
    uri = f"sqlite:///{store / 'mlflow.db'}"
    run = tracking.open_run(uri, "artifacts", "run-a", {}, {})
    (elsewhere / "note.txt").write_text("hello")
    run.log_artifacts([elsewhere / "note.txt"])
    assert list((store / "mlruns").rglob("note.txt")) and not (elsewhere / "mlruns").exists()


def test_the_suites_copied_store_is_the_store_mlflow_makes_where_it_is_opened(tmp_path, monkeypatch):
    import sqlite3

    def schema(uri):
        """The migration, and every table's and index's definition as a set of lines (MLflow's own order varies)."""
        with contextlib.closing(sqlite3.connect(uri.removeprefix("sqlite:///"))) as db:
            return (db.execute("SELECT version_num FROM alembic_version").fetchall(),
                    {name: sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())
                     for name, sql in db.execute("SELECT name, sql FROM sqlite_master")})

    monkeypatch.chdir(tmp_path)
    made = f"sqlite:///{tmp_path / 'made' / 'mlflow.db'}"
    target.check_reachable(made)
    copied = sqlite_uri(tmp_path / "copied")
    assert schema(copied) == schema(made)
    for uri in (made, copied):  # experiment 0 is made by whoever opens the store, with its artifact root
        default = MlflowClient(uri).get_experiment("0")
        assert (default.name, default.artifact_location) == ("Default", str(tmp_path / "mlruns" / "0"))


@pytest.mark.parametrize(("text", "expected"), [
    ("http://alice:s3cret@host:5000/x", "http://alice:***@host:5000/x"),
    ("https://tok_123@host/path", "https://***@host/path"),
    ("http://a:p@ss@host:5000/x", "http://a:***@host:5000/x"),
    ("http://a:p%40ss@host", "http://a:***@host"),
    ("http://a:p:ss@host", "http://a:***@host"),
    ("http://alice:pa/ss@mlflow.example:5000", "http://alice:***@mlflow.example:5000"),
    ("http://alice:p?w#x@mlflow.example:5000/api", "http://alice:***@mlflow.example:5000/api"),
    ("API request to http://u:pw@h1/api failed; retried https://tok@h2:443/api",
     "API request to http://u:***@h1/api failed; retried https://***@h2:443/api"),
    ("tracking_uri: 'http://alice:s3cret@host'\n", "tracking_uri: 'http://alice:***@host'\n"),
    ("no URI here: 5 steps, loss 1.2", "no URI here: 5 steps, loss 1.2"),
    ("ask alice@example.com about http://host:5000 or bob@example.org",
     "ask alice@example.com about http://host:5000 or bob@example.org"),
    ("http://host/?owner=alice@example.com", "http://host/?owner=alice@example.com"),
    ('{"uri":"http://host","owner":"alice@example.com"}', '{"uri":"http://host","owner":"alice@example.com"}'),
])
def test_redact_hides_every_uris_login_and_nothing_else(text, expected):
    assert login.redact(text) == expected
    assert login.redact(expected) == expected  # redacting twice changes nothing


@pytest.mark.parametrize(("uri", "stripped", "found"), [
    ("http://alice:s3cr%40t@mlflow:5000/x", "http://mlflow:5000/x", login.Login("alice", "s3cr@t")),
    ("http://a:p@ss@host:5000", "http://host:5000", login.Login("a", "p@ss")),
    ("http://alice:pa/ss@mlflow.example:5000", "http://mlflow.example:5000", login.Login("alice", "pa/ss")),
    ("http://alice:p?w#x@mlflow.example:5000", "http://mlflow.example:5000", login.Login("alice", "p?w#x")),
    ("http://bob:100%@host", "http://host", login.Login("bob", "100%")),  # not percent-encoding: as typed
    ("https://tok_123@host/path", "https://host/path", login.Login(token="tok_123")),
    ("http://host:5000", "http://host:5000", None),
    ("sqlite:///tmp/mlflow.db", "sqlite:///tmp/mlflow.db", None),
])
def test_split_login_takes_the_login_out_of_a_uri(uri, stripped, found):
    assert login.split_login(uri) == (stripped, found)


def printable_password() -> str:
    """Every printable ASCII character, the space among them, shuffled: a password a generator could make."""
    import random
    import string

    chars = list(string.printable.strip(string.whitespace[1:]) + " ")
    random.Random(7).shuffle(chars)
    return "".join(chars)


def test_redact_takes_out_a_password_of_every_printable_character_wherever_it_is_shown():
    import yaml

    password = printable_password()
    uri = f"http://alice:{password}@mlflow.example:5000/team"
    assert login.split_login(uri) == ("http://mlflow.example:5000/team", login.Login("alice", password))
    assert login.redact_uri(uri) == "http://alice:***@mlflow.example:5000/team"
    assert login.redacted({"tracking": {"tracking_uri": uri}})["tracking"]["tracking_uri"] == \
        "http://alice:***@mlflow.example:5000/team"
    written = yaml.safe_dump({"tracking": {"tracking_uri": uri}})  # quoted and escaped as YAML writes it
    assert password not in login.redact_yaml(written) and "alice:***@" in login.redact_yaml(written)
    assert password not in repr(login.Login("alice", password))


def test_resolving_takes_the_uris_login_else_mlflows_variables_and_activating_makes_it_the_only_one():
    # An older login left in the environment: MLflow would use it instead of the URI's token.
    older = {"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": "older", "MLFLOW_TRACKING_TOKEN": None}
    with environment(**older, MLFLOW_TRACKING_URI=None):
        found = target.resolve("https://tok_123@host/mlflow")
        assert found == target.TrackingTarget("https://host/mlflow", login.Login(token="tok_123"))
        found.activate()
        assert os.environ.get("MLFLOW_TRACKING_TOKEN") == "tok_123" and "MLFLOW_TRACKING_USERNAME" not in os.environ
        assert target.resolve("http://alice:p@ss@host:5000").login == login.Login("alice", "p@ss")
        os.environ.update(MLFLOW_TRACKING_USERNAME="bob", MLFLOW_TRACKING_PASSWORD="b0b")
        os.environ.pop("MLFLOW_TRACKING_TOKEN")
        assert target.resolve("http://host:5000").login == login.Login("bob", "b0b")  # no login in it: the variables'
        assert target.resolve("sqlite:///tmp/x.db").login is None  # a local store has no login
        assert target.resolve("sqlite:///tmp/x.db").variables() == {}  # and activating it changes nothing


def test_connecting_takes_the_login_out_of_mlflow_tracking_uri_too(monkeypatch):
    with environment(MLFLOW_TRACKING_URI="http://carol:c4rol@127.0.0.1:9/mlflow", MLFLOW_TRACKING_USERNAME=None,
                     MLFLOW_TRACKING_PASSWORD=None, MLFLOW_TRACKING_TOKEN=None):
        monkeypatch.setattr(target, "check_reachable", lambda uri: None)
        found = target.connect()
        # Processes started from here (a local Ray instance) inherit the variable: it no longer holds the password.
        assert found.uri == "http://127.0.0.1:9/mlflow" == os.environ["MLFLOW_TRACKING_URI"]
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "carol" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "c4rol"


def test_a_submitted_jobs_runs_name_the_submitter_and_the_commit_it_was_submitted_from(tmp_path, monkeypatch):
    recorded = provenance.job_variables()
    assert recorded[provenance.SUBMITTED_BY].startswith(provenance.os_user() + "@")
    assert recorded[provenance.SUBMITTED_COMMIT] == provenance.checkout()[0]
    # In the job: no .git, the cluster's user; the variables submit set say who and what.
    monkeypatch.setenv(provenance.SUBMITTED_BY, "alice@laptop")
    monkeypatch.setenv(provenance.SUBMITTED_COMMIT, "0123abc")
    monkeypatch.setenv(provenance.SUBMITTED_DIRTY, "true")
    provenance.current.cache_clear()
    try:
        uri = sqlite_uri(tmp_path)
        tags = MlflowClient(uri).get_run(tracking.open_run(uri, "jobs", "run-a", {}, {}).id).data.tags
        assert tags["mlflow.user"] == "alice" and tags["mlflow.source.git.commit"] == "0123abc"
        assert tags[provenance.SUBMITTED_BY_TAG] == "alice@laptop" and tags[provenance.DIRTY_TAG] == "true"
        # With a login to a tracking server, the user is the name that server knows.
        assert provenance.standard_tags("nmt train", "alice-mlflow")["mlflow.user"] == "alice-mlflow"
    finally:
        provenance.current.cache_clear()


def test_a_login_shows_in_no_warning_tag_or_config_that_ray_shows(tmp_path, caplog, monkeypatch):
    import types

    from pipeline.config import load_config
    from pipeline.train.run import build_trainer

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with caplog.at_level(logging.WARNING, logger="pipeline"):  # MLflow's message names the URL it asked
        reports.MetricLogger(tracking.Run(f"http://alice:s3cret@127.0.0.1:{free_port()}", "0" * 32)).log(
            Report({"step": 5, "loss": 1.0}))
    assert "cannot log metrics to http://alice:***@127.0.0.1" in caplog.text and "s3cret" not in caplog.text
    uri = sqlite_uri(tmp_path)
    with tracking.mlflow_run(uri, "tags", "run-a", {}, {"init_from": "https://tok_123@host/ckpt"}) as run:
        run.end_tags["note"] = "from http://alice:s3cret@host"
    tags = MlflowClient(uri).get_run(run.id).data.tags
    assert tags["init_from"] == "https://***@host/ckpt" and tags["note"] == "from http://alice:***@host"
    cfg = load_config("configs/demo.yaml", ["tracking.tracking_uri=http://alice:s3cret@host:5000"])
    trainer = build_trainer(cfg, types.SimpleNamespace(path=str(tmp_path)), "run-a", str(tmp_path / "runs"))
    assert trainer.train_loop_config["config"]["tracking"]["tracking_uri"] == "http://alice:***@host:5000"
