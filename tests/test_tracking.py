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

from pipeline.track import reports, tracking


def test_a_report_logs_its_earlier_progress_values_at_their_own_steps_and_times(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("paced")).info.run_id
    earlier = [{"step": s, "time": 1_700_000_000.0 + s, "train_loss": 10.0 - s, "lr": 0.1} for s in (5, 10, 15)]
    reports.MetricLogger(tracking.Run(uri, run_id)).log({
        "step": 20, "train_loss": 5.0, "val_bleu": 1.5, "param_checksum": 41.5, "averaged": 2,
        tracking.PROGRESS_KEY: earlier, tracking.FINAL_KEY: False})
    history = sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(5, 5.0), (10, 0.0), (15, -5.0), (20, 5.0)]
    assert [m.timestamp for m in history[:3]] == [1_700_000_005_000, 1_700_000_010_000, 1_700_000_015_000]
    # The averaged checkpoint's scores are charts of their own: a learning curve ends with the run's own model.
    assert not client.get_metric_history(run_id, "val_bleu")
    assert [m.step for m in client.get_metric_history(run_id, "val_bleu_averaged")] == [20]
    internal = {"time", "step", "param_checksum", "averaged", tracking.PROGRESS_KEY, tracking.FINAL_KEY}
    assert not internal & set(client.get_run(run_id).data.metrics)  # no charts of the loop's own checks


def test_a_run_has_mlflow_standard_tags_and_its_datasets_once_however_often_they_are_logged(tmp_path):
    import getpass

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = tracking.open_run(uri, "tags", "run-a", {"train.epochs": 3}, {}, source="nmt train")
    again = tracking.open_run(uri, "tags", "run-a", {"train.epochs": 3}, {}, source="nmt train")  # a resume
    assert again == first
    run_id = first.id
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags["mlflow.source.name"] == "nmt train" and run.data.tags["mlflow.user"] == getpass.getuser()
    assert run.data.tags["mlflow.runName"] == "run-a" and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert run.data.tags.get("mlflow.source.git.commit", "unknown") == tracking.git_commit()
    datasets = [{"name": f"demo-en-de-0123/{split}", "digest": "0123456789abcdef", "source": f"s3://b/p/{split}",
                 "context": split, "profile": {"pairs": n}} for split, n in (("train", 30), ("validation", 5))]
    for _ in range(2):  # a resumed run logs them again
        first.log_datasets(datasets)
    inputs = MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    assert sorted((i.dataset.name, i.tags[0].value, i.dataset.digest, i.dataset.source_type) for i in inputs) == [
        ("demo-en-de-0123/train", "train", "0123456789abcdef", "s3"),
        ("demo-en-de-0123/validation", "validation", "0123456789abcdef", "s3")]


def test_values_the_store_refuses_stay_queued_and_the_last_report_retries_then_says_what_was_lost(
        tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    metric_logger = reports.MetricLogger(tracking.Run(f"http://127.0.0.1:{free_port()}", "0" * 32))  # no one there
    metric_logger.FINAL_WAIT_S = 3.0
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        start = time.monotonic()
        metric_logger.log({"step": 5, "train_loss": 1.0})
        assert time.monotonic() - start < 2.5  # a report during training never waits for the store
        assert len(metric_logger.pending) == 1 and "training goes on" in caplog.text
        start = time.monotonic()
        metric_logger.log({"step": 10, "train_loss": 0.5, tracking.FINAL_KEY: True})
        assert time.monotonic() - start >= 3.0  # the last one retried for FINAL_WAIT_S
    assert "did not answer within 3s after training: 2 metric values were not logged" in caplog.text


def test_a_run_made_by_mlflow_run_becomes_the_commands_run_keeping_its_source_tags(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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


@pytest.mark.parametrize(("text", "expected"), [
    ("http://alice:s3cret@host:5000/x", "http://alice:***@host:5000/x"),
    ("https://tok_123@host/path", "https://***@host/path"),
    ("http://a:p@ss@host:5000/x", "http://a:***@host:5000/x"),
    ("http://a:p%40ss@host", "http://a:***@host"),
    ("http://a:p:ss@host", "http://a:***@host"),
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
    assert tracking.redact(text) == expected
    assert tracking.redact(expected) == expected  # redacting twice changes nothing


@pytest.mark.parametrize(("uri", "stripped", "login"), [
    ("http://alice:s3cr%40t@mlflow:5000/x", "http://mlflow:5000/x",
     {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "s3cr@t"}),
    ("http://a:p@ss@host:5000", "http://host:5000",
     {"MLFLOW_TRACKING_USERNAME": "a", "MLFLOW_TRACKING_PASSWORD": "p@ss"}),
    ("https://tok_123@host/path", "https://host/path", {"MLFLOW_TRACKING_TOKEN": "tok_123"}),
    ("http://host:5000", "http://host:5000", {}),
    ("sqlite:///tmp/mlflow.db", "sqlite:///tmp/mlflow.db", {}),
])
def test_split_credentials_takes_the_login_out_of_a_uri(uri, stripped, login):
    assert tracking.split_credentials(uri) == (stripped, login)


def test_resolving_moves_the_uris_login_into_mlflows_variables():
    # An older login left in the environment: MLflow would use it instead of the URI's token.
    older = {"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": "older", "MLFLOW_TRACKING_TOKEN": None}
    with environment(**older, MLFLOW_TRACKING_URI=None):
        assert tracking.resolve_tracking_uri("https://tok_123@host/mlflow") == "https://host/mlflow"
        assert tracking.credentials() == {"MLFLOW_TRACKING_TOKEN": "tok_123"}
        assert tracking.resolve_tracking_uri("http://alice:p@ss@host:5000") == "http://host:5000"
        assert tracking.credentials() == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "p@ss"}
        assert tracking.resolve_tracking_uri("http://host:5000") == "http://host:5000"  # no login: the variables stay
        assert tracking.credentials()["MLFLOW_TRACKING_PASSWORD"] == "p@ss"
        # From MLFLOW_TRACKING_URI: the variable loses the login too, so processes started from here never see it.
        os.environ["MLFLOW_TRACKING_URI"] = "http://carol:c4rol@host/mlflow"
        assert tracking.resolve_tracking_uri() == "http://host/mlflow" == os.environ["MLFLOW_TRACKING_URI"]
        assert tracking.credentials() == {"MLFLOW_TRACKING_USERNAME": "carol", "MLFLOW_TRACKING_PASSWORD": "c4rol"}


def test_a_login_shows_in_no_warning_tag_or_config_that_ray_shows(tmp_path, caplog, monkeypatch):
    import types

    from pipeline.config import load_config
    from pipeline.train.run import build_trainer

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with caplog.at_level(logging.WARNING, logger="pipeline"):  # MLflow's message names the URL it asked
        reports.MetricLogger(tracking.Run(f"http://alice:s3cret@127.0.0.1:{free_port()}", "0" * 32)).log(
            {"step": 5, "loss": 1.0})
    assert "cannot log metrics to http://alice:***@127.0.0.1" in caplog.text and "s3cret" not in caplog.text
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with tracking.mlflow_run(uri, "tags", "run-a", {}, {"init_from": "https://tok_123@host/ckpt"}) as run:
        run.end_tags["note"] = "from http://alice:s3cret@host"
    tags = MlflowClient(uri).get_run(run.id).data.tags
    assert tags["init_from"] == "https://***@host/ckpt" and tags["note"] == "from http://alice:***@host"
    cfg = load_config("configs/demo.yaml", ["tracking.tracking_uri=http://alice:s3cret@host:5000"])
    trainer = build_trainer(cfg, types.SimpleNamespace(path=str(tmp_path)), "run-a", str(tmp_path / "runs"))
    assert trainer.train_loop_config["config"]["tracking"]["tracking_uri"] == "http://alice:***@host:5000"
