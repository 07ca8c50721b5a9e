"""The packaged model and the registry: pyfunc in a fresh process, `mlflow models serve`, champion rule, CLIs."""

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from conftest import free_port, stop_process, wait_http
from mlflow.tracking import MlflowClient

from pipeline.cli import main
from pipeline.common.environment import environment
from pipeline.text.translator import Translator
from pipeline.track import champion as champion_rule
from pipeline.track import registry, tracking

pytestmark = [pytest.mark.slow]

EXAMPLES = ["a small dog runs .", "the woman sees two red houses ."]


def _env(uri: str) -> dict[str, str]:
    # `mlflow models serve` execs uvicorn from PATH, as in an activated virtual environment.
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": path}


def test_training_logs_pictures_samples_and_a_registered_version(champion):
    client = MlflowClient(champion.uri)
    artifacts = {a.path for a in client.list_artifacts(champion.run_id)}
    assert {"learning_curves.png", "attention", "samples.json"} <= artifacts
    attention = {a.path for a in client.list_artifacts(champion.run_id, "attention")}
    assert {"attention/sentence1_encoder_self.png", "attention/sentence1_decoder_self.png",
            "attention/sentence1_cross.png"} <= attention
    # They are objects in the server's bucket (--artifacts-destination s3://...), the packaged model too.
    import boto3

    bucket, prefix = champion.artifacts.removeprefix("s3://").split("/", 1)
    keys = [o["Key"] for page in boto3.client("s3").get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix) for o in page.get("Contents", [])]
    assert any(k.endswith(f"/{champion.run_id}/artifacts/learning_curves.png") for k in keys), keys[:20]
    assert any(k.endswith("/MLmodel") for k in keys) and any(k.endswith(".safetensors") for k in keys), keys
    version = client.get_model_version(champion.model_name, champion.version)
    assert version.run_id == champion.run_id
    assert float(version.tags["val_bleu"]) == pytest.approx(champion.val_bleu, abs=1e-3)
    assert {"data_manifest", "git_commit", "run_id"} <= set(version.tags)
    assert client.get_model_version_by_alias(champion.model_name, "champion").version == champion.version


def test_a_training_run_shows_its_source_system_metrics_and_datasets_in_mlflow(champion):
    run = MlflowClient(champion.uri).get_run(champion.run_id)
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "nmt train" and tags["mlflow.user"] and tags["mlflow.runName"]
    assert tags.get("mlflow.source.git.commit", "unknown") == tags["git_commit"]
    # MLflow's own system metrics, logged by Ray Train's controller while the run trained
    system = {key for key in run.data.metrics if key.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system, system
    assert not {"param_checksum", "averaged"} & set(run.data.metrics)  # the loop's own checks are no charts
    best = champion.outcome.metrics  # the best checkpoint's report: the averaged one when averaging helped
    assert tags.get("averaged_checkpoints") == (str(best["averaged"]) if "averaged" in best else None)
    # The runs table shows the best validation; the averaged checkpoint's score is a chart of its own.
    assert run.data.metrics["best_val_bleu"] == pytest.approx(best["val_bleu"])
    assert run.data.metrics["best_step"] == best["step"]
    assert "val_bleu_averaged" in run.data.metrics or champion.cfg.train.average_last < 2
    inputs = {i.tags[0].value: i.dataset for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"train", "validation", "test"}
    manifest = champion.outcome.manifest
    assert all(d.digest == manifest.sha256 and d.name.endswith(f"/{split}") for split, d in inputs.items())
    assert json.loads(inputs["train"].source)["uri"] == manifest.split_dir("train")
    assert json.loads(inputs["train"].profile)["pairs"] == manifest.content["splits"]["train"]["pairs"]


def test_packaged_model_translates_in_a_fresh_process_from_its_own_code(champion, tmp_path):
    script = textwrap.dedent(f"""
        import json, sys, mlflow
        model = mlflow.pyfunc.load_model("models:/{champion.model_name}@champion")
        import pandas as pd
        out = model.predict(pd.DataFrame({{"src": {EXAMPLES!r}}}), params={{"beam_size": 2}})
        import pipeline.text.translator
        print(json.dumps({{"translations": out["translation"].tolist(),
                          "code": pipeline.text.translator.__file__,
                          "schema": model.metadata.get_input_schema().input_names(),
                          "params": [p.name for p in model.metadata.get_params_schema().params]}}))
    """)
    # Run outside the repo: the model must bring its own code.
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(champion.uri),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["translations"]) == 2 and all(isinstance(t, str) for t in result["translations"])
    assert "/code/pipeline/text/translator.py" in result["code"]  # loaded from the model, not from this checkout
    assert result["schema"] == ["src"] and set(result["params"]) == {"beam_size", "max_len"}


def test_registered_model_holds_no_pickles(champion, tmp_path):
    local = _downloaded(champion, tmp_path)
    files = [os.path.relpath(os.path.join(d, f), local) for d, _, names in os.walk(local) for f in names]
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pt", ".pth", ".bin", ".joblib"))], files
    assert any(f.endswith("model.safetensors") for f in files) and any(f.endswith("spm.model") for f in files)
    mlmodel = open(os.path.join(local, "MLmodel")).read()
    # Models from Code: MLflow loads pyfunc_model.py, never a cloudpickled python_model.pkl.
    assert "loader_module: mlflow.pyfunc.loaders.code_model" in mlmodel and "python_model.pkl" not in mlmodel


def test_mlflow_models_serve_answers_invocations(champion, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{champion.model_name}@champion",
         "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=_env(champion.uri), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", 180, process)
        body = {"dataframe_split": {"columns": ["src"], "data": [[e] for e in EXAMPLES]}, "params": {"beam_size": 2}}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            predictions = json.loads(response.read())["predictions"]
        assert [set(p) for p in predictions] == [{"translation"}] * 2
    finally:
        stop_process(process)
        log.close()
    # The served model translates as the version's own files do, at the beam the request asked for.
    expected = Translator.from_files(_translator_files(champion)).translate(EXAMPLES, beam_size=2)
    assert [p["translation"] for p in predictions] == expected


def test_champion_moves_only_when_val_bleu_improves_and_promote_moves_it_by_hand(champion, capsys):
    translator = Translator.from_files(_translator_files(champion))
    first = champion_rule.champion_bleu(champion.uri, champion.model_name)
    assert first == (champion.version, pytest.approx(champion.val_bleu, abs=1e-3))
    try:
        run = tracking.Run(champion.uri, champion.run_id)
        worse = registry.register(run, translator, champion.model_name, champion.val_bleu - 1.0, {},
                                  example=EXAMPLES[0])
        assert not worse.champion
        assert champion_rule.champion_bleu(champion.uri, champion.model_name)[0] == champion.version
        better = registry.register(run, translator, champion.model_name, champion.val_bleu + 1.0, {},
                                   example=EXAMPLES[0])
        assert better.champion and champion_rule.champion_bleu(champion.uri, champion.model_name)[0] == better.version
        assert main(["promote", worse.version, "--set", f"tracking.tracking_uri={champion.uri}"]) == 0
        assert champion_rule.champion_bleu(champion.uri, champion.model_name)[0] == worse.version
        assert main(["promote", "999", "--set", f"tracking.tracking_uri={champion.uri}"]) == 2
        assert "has no version 999" in capsys.readouterr().err
    finally:  # later tests look for the original champion
        champion_rule.promote(champion.uri, champion.model_name, champion.version)


def test_two_registrations_at_once_leave_the_better_one_champion(champion, monkeypatch):
    """The worse version's alias write is slowed down and lands last: its writer's next read moves it back."""
    import threading

    translator = Translator.from_files(_translator_files(champion))
    set_alias = MlflowClient.set_registered_model_alias
    slow = {}

    def delayed(self, name, alias, version):
        if str(version) == slow.get("version"):
            time.sleep(2.0)
        return set_alias(self, name, alias, version)

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", delayed)
    create = MlflowClient.create_model_version

    def remember_worse(self, name, source, **kwargs):
        version = create(self, name, source, **kwargs)
        if float(kwargs["tags"]["val_bleu"]) < champion.val_bleu + 2:
            slow["version"] = str(version.version)
        return version

    monkeypatch.setattr(MlflowClient, "create_model_version", remember_worse)
    results = {}
    barrier = threading.Barrier(2)

    def register(gain: float) -> None:
        barrier.wait()
        results[gain] = registry.register(tracking.Run(champion.uri, champion.run_id), translator,
                                          champion.model_name, champion.val_bleu + gain, {}, example=EXAMPLES[0])

    try:
        threads = [threading.Thread(target=register, args=(gain,)) for gain in (1.0, 2.0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert set(results) == {1.0, 2.0}
        assert champion_rule.champion_bleu(champion.uri, champion.model_name)[0] == results[2.0].version
        assert results[2.0].champion
        tags = MlflowClient(champion.uri).get_model_version(champion.model_name, results[1.0].version).tags
        assert tags["champion_decision"] in ("champion", f"kept version {results[2.0].version}")
    finally:
        monkeypatch.undo()
        champion_rule.promote(champion.uri, champion.model_name, champion.version)


def test_a_version_left_undecided_is_decided_by_the_next_promote(champion, capsys):
    client = MlflowClient(champion.uri)
    source = client.get_model_version(champion.model_name, champion.version)
    # What a registration that died after creating its version leaves: no decision, a better val_bleu.
    orphan = client.create_model_version(champion.model_name, source.source, run_id=champion.run_id,
                                         model_id=source.source.removeprefix("models:/"),
                                         tags={"val_bleu": f"{champion.val_bleu + 5:.4f}"})
    try:
        assert champion_rule.champion_bleu(champion.uri, champion.model_name)[0] != str(orphan.version)
        assert main(["promote", "--set", f"tracking.tracking_uri={champion.uri}"]) == 0
        assert f"version {orphan.version} " in capsys.readouterr().out
        assert champion_rule.champion_bleu(champion.uri, champion.model_name)[0] == str(orphan.version)
        assert client.get_model_version(champion.model_name, orphan.version).tags["champion_decision"] == "champion"
    finally:
        champion_rule.promote(champion.uri, champion.model_name, champion.version)


def test_a_champion_that_cannot_be_read_is_an_error_not_no_champion(monkeypatch):
    from pipeline.common.errors import UserError

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(UserError, match="cannot read registered model 'm'"):
        champion_rule.champion_bleu(f"http://127.0.0.1:{free_port()}", "m")


def _downloaded(champion, destination=None) -> str:
    """The champion version's files, looked up in its server's registry (the process-wide URIs left alone)."""
    import mlflow

    with environment(MLFLOW_TRACKING_URI=champion.uri, MLFLOW_REGISTRY_URI=champion.uri):
        return mlflow.artifacts.download_artifacts(f"models:/{champion.model_name}/{champion.version}",
                                                   dst_path=destination)


def _translator_files(champion):
    return os.path.join(_downloaded(champion), "artifacts", "translator")


def test_evaluate_scores_a_split_and_logs_a_linked_evaluation_run(champion, capsys):
    settings = ["--set", f"tracking.tracking_uri={champion.uri}", "--set", f"tracking.experiment={champion.experiment}"]
    assert main(["evaluate", "--split", "test", *settings]) == 0  # no --beam: the model's own settings
    out = capsys.readouterr().out
    assert "BLEU" in out and "nrefs:1|case:mixed" in out and "case:lc" in out and "chrF" in out
    client = MlflowClient(champion.uri)
    version = client.get_model_version(champion.model_name, champion.version)
    run = client.get_run(version.tags["test_eval_run"])
    assert run.data.tags["model_version"] == champion.version and run.data.tags["source_run_id"] == champion.run_id
    assert {"test_bleu", "test_chrf", "test_bleu_lc"} <= set(run.data.metrics)
    train = champion.cfg.train
    decoding = {"beam_size": str(train.beam_size), "length_penalty": str(train.length_penalty)}
    assert {k: run.data.params[k] for k in decoding} == decoding  # what validation used, stored with the version
    assert {k: version.tags[k] for k in decoding} == decoding
    assert float(version.tags["test_bleu"]) == pytest.approx(run.data.metrics["test_bleu"], abs=0.01)


def test_evaluate_refuses_files_that_do_not_pair(champion, tmp_path, capsys):
    (tmp_path / "src.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "ref.txt").write_text("eins\nzwei\n")
    code = main(["evaluate", "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt"),
                 "--set", f"tracking.tracking_uri={champion.uri}"])
    err = capsys.readouterr().err
    assert code == 2 and "src.txt has 3 lines but" in err and "ref.txt has 2" in err and "Traceback" not in err


def test_translate_prints_one_line_per_sentence(champion, tmp_path, capsys, monkeypatch):
    settings = ["--set", f"tracking.tracking_uri={champion.uri}"]
    assert main(["translate", *EXAMPLES, "--beam", "1", *settings]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    (tmp_path / "in.txt").write_text("\n".join(EXAMPLES * 3) + "\n")
    assert main(["translate", "--input", str(tmp_path / "in.txt"), *settings]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 6 and "6/6 sentences" in captured.err
    # Lines on stdin, as in `cat in.txt | nmt translate`: the same, with progress on stderr.
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(EXAMPLES * 2) + "\n"))
    assert main(["translate", "--beam", "1", *settings]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 4 and "4/4 sentences" in captured.err


def test_a_model_uri_that_does_not_exist_is_a_clear_error(champion, capsys):
    code = main(["translate", "hello", "--model", "models:/no-such-model@champion",
                 "--set", f"tracking.tracking_uri={champion.uri}"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot load model 'models:/no-such-model@champion'" in err and "Traceback" not in err


STORED_CODE = """
import pathlib

import mlflow

pathlib.Path(MARKER).write_text("code stored with a model ran")


class Anything(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


mlflow.models.set_model(Anything())
"""


def test_loading_a_model_by_uri_runs_no_code_stored_with_it(champion, tmp_path, capsys):
    """A model anyone on a shared server could log, whose code runs on import: nmt reads only its data files."""
    marker = tmp_path / "ran"
    code = tmp_path / "stored_code.py"
    code.write_text(STORED_CODE.replace("MARKER", repr(str(marker))))
    # Logged by another process, as another user would: MLflow's fluent API (active run and experiment,
    # kept in this process's environment) must not leak into the tests that follow.
    log = textwrap.dedent(f"""
        import mlflow
        mlflow.set_experiment({champion.experiment!r})
        with mlflow.start_run(run_name="stored-code") as run:
            mlflow.pyfunc.log_model(name="bare", python_model={str(code)!r})
            mlflow.pyfunc.log_model(name="armed", python_model={str(code)!r},
                                    artifacts={{"translator": {_translator_files(champion)!r}}})
        print(run.info.run_id)
    """)
    logged = subprocess.run([sys.executable, "-c", log], env=_env(champion.uri), capture_output=True, text=True,
                            timeout=300)
    assert logged.returncode == 0, logged.stderr[-2000:]
    run_id = logged.stdout.strip().splitlines()[-1]
    marker.unlink(missing_ok=True)  # logging may import it; from here on nothing may
    settings = ["--set", f"tracking.tracking_uri={champion.uri}"]
    assert main(["translate", "a dog", "--model", f"runs:/{run_id}/bare", *settings]) == 2
    err = capsys.readouterr().err
    assert "has no artifacts/translator/" in err and len(err.strip().splitlines()) == 1
    assert main(["translate", *EXAMPLES, "--beam", "1", "--model", f"runs:/{run_id}/armed", *settings]) == 0
    armed = capsys.readouterr().out.splitlines()
    assert main(["translate", *EXAMPLES, "--beam", "1", *settings]) == 0  # the champion: the same files
    assert armed == capsys.readouterr().out.splitlines() and len(armed) == 2
    assert not marker.exists()


def test_export_attaches_a_ctranslate2_model_that_translate_and_evaluate_can_use(champion, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    settings = ["--set", f"tracking.tracking_uri={champion.uri}", "--set", f"tracking.experiment={champion.experiment}"]
    model = f"models:/{champion.model_name}/{champion.version}"
    client = MlflowClient(champion.uri)
    code = main(["translate", "--model", model, "--engine", "ctranslate2", "a dog", *settings])
    assert code == 2 and "has no CTranslate2 export: run `nmt export" in capsys.readouterr().err
    try:
        assert main(["export", "--model", model, "--quantization", "float32", "--out", str(tmp_path / "ct2"),
                     *settings]) == 0
        assert f"attached to {champion.model_name} version {champion.version}" in capsys.readouterr().out
        assert client.get_model_version(champion.model_name, champion.version).tags["ctranslate2"] == "float32"
        assert any(a.path == "ctranslate2/model.bin" for a in client.list_artifacts(champion.run_id, "ctranslate2"))
        outputs = {}
        for engine in ("ctranslate2", "pytorch"):  # greedy: the same network, so the same translations
            assert main(["translate", "--model", model, "--engine", engine, "--beam", "1", *EXAMPLES, *settings]) == 0
            outputs[engine] = capsys.readouterr().out.splitlines()
        assert outputs["ctranslate2"] == outputs["pytorch"] and len(outputs["pytorch"]) == 2
        assert main(["evaluate", "--model", model, "--split", "test", "--beam", "1", *settings]) == 0  # auto
        version = client.get_model_version(champion.model_name, champion.version)
        assert client.get_run(version.tags["test_eval_run"]).data.tags["engine"] == "ctranslate2"
    finally:  # the other tests of the session translate the champion with PyTorch
        client.delete_model_version_tag(champion.model_name, champion.version, "ctranslate2")
