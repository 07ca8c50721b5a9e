"""Credentials inside a URI (s3://KEY_ID:SECRET@bucket, postgresql://user:password@db) never reach a job, a log
line, a tag or a dataset source: `nmt submit` refuses them, saying where they go instead; the pipeline hides them."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient
from small import ROOT
from stores import sqlite_uri

from pipeline.common import log
from pipeline.common.errors import UserError
from pipeline.launch.submit import plan
from pipeline.track import tracking

KEY_ID, SECRET, DB_PASSWORD = "AKIAEXAMPLE7Q", "wJalr/XUtnFEMI+K7MDENG", "db-pw-8d1f"
S3 = f"s3://{KEY_ID}:{SECRET}@bucket/corpus"
DATABASE = f"postgresql+psycopg://mlflow:{DB_PASSWORD}@db.example:5432/mlflow"


@pytest.mark.parametrize(("command", "variable", "where"), [
    (["train", "--set", f"tracking.tracking_uri={DATABASE}"], "PGPASSWORD", "tracking.tracking_uri"),
    (["train"], "PGPASSWORD", "tracking.tracking_uri"),  # from MLFLOW_TRACKING_URI
    (["prepare", "--config", "configs/multi30k_en_de.yaml", "--set", f"data.path={S3}"],
     "AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY", "data.path"),
    (["tune", "--config", "configs/demo.yaml", "--space", "tune_spaces/demo.yaml",
      "--set", f"train.storage_path={S3}"], "AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY", "train.storage_path"),
    (["evaluate", "--data", S3], "AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY", "argument"),
])
def test_uri_credentials_are_refused_by_submit_saying_where_they_go(command, variable, where, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    if command == ["train"]:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", DATABASE)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # a sweep's key, made here
    with pytest.raises(UserError) as refused:
        plan(command, "http://127.0.0.1:8265", pip=False)
    message = str(refused.value)
    assert message.startswith(where) and f"--forward-env {variable}" in message, message
    assert SECRET not in message and KEY_ID not in message and DB_PASSWORD not in message, message
    assert len(message.splitlines()) == 1


def test_uri_credentials_a_user_name_alone_or_a_split_mlflow_login_still_plan(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for uri in ("postgresql://mlflow@db.example/mlflow", "http://alice:pw@mlflow.example:5000"):
        job = plan(["train", "--set", f"tracking.tracking_uri={uri}", "--set",
                    "data.output_dir=abfs://container@account.dfs.core.windows.net/prepared"],
                   "http://127.0.0.1:8265", pip=False)
        assert "pw" not in job.entrypoint and "container@account" in job.entrypoint


@pytest.mark.parametrize(("uri", "usable"), [
    (S3, "s3://bucket/corpus"),
    (DATABASE, "postgresql+psycopg://mlflow@db.example:5432/mlflow"),
    ("https://tok_123@mlflow.example/x", "https://mlflow.example/x"),
    ("gs://bucket/p@th/x", "gs://bucket/p@th/x"),
    ("hf://datasets/org/name@main", "hf://datasets/org/name@main"),
    ("abfs://container@account.dfs.core.windows.net/x", "abfs://container@account.dfs.core.windows.net/x"),
])
def test_uri_credentials_taken_out_leave_a_usable_path(uri, usable):
    from pipeline.common import userinfo

    assert userinfo.without_secret(uri) == usable
    assert userinfo.secret_in(uri) == (uri != usable)


def test_uri_credentials_are_hidden_in_log_lines_tags_params_and_dataset_sources(tmp_path, capsys):
    log.get("data").warning(f"cannot read {S3}/train.tsv (retrying); store {DATABASE}")
    line = capsys.readouterr().err
    assert "s3://***@bucket/corpus/train.tsv" in line and "mlflow:***@db.example" in line, line
    for value in (SECRET, KEY_ID, DB_PASSWORD):
        assert value not in line

    uri = sqlite_uri(tmp_path)
    run = tracking.open_run(uri, "paths", "run-1", {"data.path": S3}, {"data_path": S3})
    run.log_datasets([{"name": "corpus/train", "digest": "0" * 64, "source": f"{S3}/train", "context": "train",
                       "profile": {"pairs": 1}}])
    found = MlflowClient(uri).get_run(run.id)
    shown = json.dumps([found.data.tags, found.data.params,
                        [d.dataset.source for d in found.inputs.dataset_inputs]])
    assert SECRET not in shown and KEY_ID not in shown, shown
    assert json.loads(found.inputs.dataset_inputs[0].dataset.source)["uri"] == "s3://bucket/corpus/train"


def test_uri_credentials_the_registered_versions_data_path_tag_is_the_path_without_them(monkeypatch):
    """The version's data_path tag (which `nmt evaluate` reads back to find the data) holds no secret."""
    import contextlib
    import types

    from pipeline.config import load_config
    from pipeline.text.translator import Translator
    from pipeline.track import publish, registry, report

    registered = {}
    monkeypatch.setattr(registry, "version_of_run", lambda *args: None)
    monkeypatch.setattr(registry, "register", lambda run, translator, name, score, tags, **kw: registered.update(tags))
    translator = types.SimpleNamespace(beam_size=4, alpha=0.6)
    monkeypatch.setattr(Translator, "from_checkpoint", lambda *args, **kw: translator)
    monkeypatch.setattr(report, "log_run_report", lambda *args, **kw: None)
    monkeypatch.setattr(report, "validation_sample", lambda *args: [("a source sentence", "")])
    no_tags = types.SimpleNamespace(data=types.SimpleNamespace(tags={}))
    run = types.SimpleNamespace(uri="sqlite:///x.db", id="0" * 32, client=lambda: types.SimpleNamespace(
        get_run=lambda run_id: no_tags))
    manifest = types.SimpleNamespace(sha256="0" * 64, path=f"{S3}/prepared", tokenizer=lambda: None)
    best = types.SimpleNamespace(as_directory=lambda: contextlib.nullcontext("/nowhere"))
    publish.publish(load_config(ROOT / "configs" / "demo.yaml"), run, best, {"val_bleu": 1.0}, manifest)
    assert registered["data_path"] == "s3://bucket/corpus/prepared"
