"""`nmt submit` against the session's Ray instance, which requires the auth token Ray made for it (Ray 2.60 turns
token authentication on for a local instance), through its dashboard at 127.0.0.1."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import types
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from small import ROOT

VENV_BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.timeout(900)]


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any Ray address or auth settings, plus extra."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                        "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                        "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # the job's `python` is this venv's
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster(ray_dashboard):
    """The session's Ray as a cluster to submit to: its dashboard, its token, and this process's settings without
    any Ray address or auth variable, the token named by path."""
    env = _clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(ray_dashboard.token_file))
    token_file = ray_dashboard.token_file
    return types.SimpleNamespace(address=ray_dashboard.address, root=ray_dashboard.session_dir, env=env,
                                 token=token_file.read_text().strip(), token_file=token_file)


def _submit(args: list[str], env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "submit", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout_s)


def _job(cluster, job_id: str) -> dict:
    """The job's record from the Jobs REST API, with our token (not this process's Ray settings)."""
    request = urllib.request.Request(f"{cluster.address}/api/jobs/{job_id}",
                                     headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _job_logs(cluster, job_id: str) -> str:
    request = urllib.request.Request(f"{cluster.address}/api/jobs/{job_id}/logs",
                                     headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["logs"]


@pytest.mark.slow
def test_failing_job_exits_non_zero(cluster, tmp_path):
    result = _submit(["--address", cluster.address, "--follow", "--no-pip", "--", "prepare", "--set",
                      "data.source=files", "--set", f"data.path={tmp_path / 'missing'}", "--set",
                      f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"], cluster.env)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "FAILED" in result.stderr
    assert "is not a directory" in result.stdout  # the job's error, streamed here


def test_bad_command_is_refused_before_submitting():
    result = _submit(["--address", "http://127.0.0.1:1", "--", "train", "--set", "train.epochz=1"], _clean_env())
    assert result.returncode == 2
    assert "train.epochz" in result.stderr and "did you mean 'train.epochs'" in result.stderr
    assert "Traceback" not in result.stderr and "submitted" not in result.stderr


@pytest.mark.slow
def test_cluster_refuses_missing_or_wrong_token(cluster, tmp_path):
    command = ["--address", cluster.address, "--no-pip", "--", "prepare"]
    no_token = _submit(command, _clean_env(HOME=str(tmp_path)), timeout_s=120)  # no ~/.ray/auth_token there
    assert no_token.returncode == 2, no_token.stderr
    assert "requires a Ray auth token and none was found" in no_token.stderr
    assert "RAY_AUTH_TOKEN" in no_token.stderr and "Traceback" not in no_token.stderr

    wrong = _submit(command, _clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="not-the-token"), timeout_s=120)
    assert wrong.returncode == 2, wrong.stderr
    assert "refused the auth token from RAY_AUTH_TOKEN" in wrong.stderr and "Traceback" not in wrong.stderr

    token_but_no_mode = _submit(command, _clean_env(RAY_AUTH_TOKEN_PATH=str(cluster.token_file)), timeout_s=120)
    assert token_but_no_mode.returncode == 2
    assert "set RAY_AUTH_MODE=token" in token_but_no_mode.stderr


def test_nothing_listening_is_a_clear_error():
    result = _submit(["--address", f"http://127.0.0.1:{free_port()}", "--", "prepare"], _clean_env(), timeout_s=120)
    assert result.returncode == 2
    assert "nothing answers at http://127.0.0.1:" in result.stderr and "Traceback" not in result.stderr
    missing = _submit(["--", "prepare"], _clean_env(), timeout_s=120)
    assert missing.returncode == 2 and "no cluster address" in missing.stderr


def test_plan_passes_paths_and_store_explicitly(tmp_path, monkeypatch):
    from pipeline.launch.submit import EXCLUDES, plan, requirements

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    job = plan(["nmt", "train", "--config", str(ROOT / "configs" / "demo.yaml")], "http://127.0.0.1:8265")
    assert job.entrypoint.startswith("python -m pipeline train --config configs/demo.yaml ")
    assert f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}" in job.entrypoint  # relative made absolute
    assert f"train.storage_path={tmp_path / 'runs'}" in job.entrypoint
    assert job.runtime_env["working_dir"] == str(ROOT) and "/.venv/" in EXCLUDES
    assert job.runtime_env["pip"]["packages"] == requirements() and not any(
        r.startswith("ray") for r in requirements())
    assert job.warnings == []
    remote = plan(["train", "--set", "train.storage_path=s3://bucket/runs"], "http://10.0.0.5:8265", pip=False)
    assert "pip" not in remote.runtime_env
    # Not asked (plan makes no network calls): an address elsewhere only warns.
    assert any("tracking.tracking_uri=sqlite:///" in w for w in remote.warnings)
    assert not any("train.storage_path" in w for w in remote.warnings)
    with pytest.raises(Exception, match="outside the project"):
        outside = tmp_path / "mine.yaml"
        outside.write_text("train: {epochs: 1}\n")
        plan(["train", "--config", str(outside)], "http://127.0.0.1:8265")


def test_plan_refuses_local_stores_and_paths_for_a_cluster_that_does_not_see_them(tmp_path, monkeypatch):
    from pipeline.common.errors import UserError
    from pipeline.launch.submit import plan

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    remote = ["--set", "tracking.tracking_uri=http://mlflow:5000", "--set", "train.storage_path=s3://b/runs",
              "--set", "data.output_dir=s3://b/prepared"]
    cases = {
        "tracking.tracking_uri=sqlite:///": ["train"],
        "train.storage_path=": ["train", "--set", "tracking.tracking_uri=http://mlflow:5000",
                                "--set", "data.output_dir=s3://b/prepared"],
        "data.output_dir=": ["prepare"],
        "data.path=": ["prepare", *remote, "--config", str(ROOT / "configs" / "multi30k_en_de.yaml")],
    }
    for key, command in cases.items():
        with pytest.raises(UserError, match=f"does not see this machine's files.*{key}"):
            plan(command, "http://127.0.0.1:8265", pip=False, remote=True)
        assert plan(command, "http://127.0.0.1:8265", pip=False, remote=False).warnings == []  # a shared disk
    # Storage URIs and a tracking server pass; promote touches no storage, evaluate none but the server's.
    assert plan(["train", *remote], "http://127.0.0.1:8265", pip=False, remote=True).warnings == []
    assert plan(["promote", "3", "--set", "tracking.tracking_uri=http://mlflow:5000"], "http://127.0.0.1:8265",
                pip=False, remote=True).warnings == []
    with pytest.raises(UserError, match="tracking.tracking_uri"):
        plan(["evaluate", "--split", "test"], "http://127.0.0.1:8265", pip=False, remote=True)


def test_the_cluster_is_asked_whether_it_sees_this_machine(monkeypatch, tmp_path):
    """Through a tunnel the address is 127.0.0.1 either way: the nodes' raylet sockets decide."""
    import socket

    from pipeline.launch import dashboard

    here = tmp_path / "raylet"
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(here))

    class Client:
        def __init__(self, sockets):
            self.sockets = sockets

        def _do_request(self, method, endpoint, **kwargs):
            assert (method, endpoint) == ("GET", "/nodes?view=summary")
            nodes = [{"raylet": {"state": "ALIVE", "rayletSocketName": path}} for path in self.sockets]
            nodes.append({"raylet": {"state": "DEAD", "rayletSocketName": "/gone/raylet"}})
            return types.SimpleNamespace(json=lambda: {"data": {"summary": nodes}})

    for sockets, remote in (([str(here)], False), ([str(here), "/elsewhere/raylet"], True), ([], None)):
        monkeypatch.setattr(dashboard, "client", lambda address, s=sockets: Client(s))
        assert dashboard.cluster_is_remote("http://127.0.0.1:8265") is remote, sockets
    listening.close()


def test_plan_keeps_credentials_out_of_the_command_and_env_vars(monkeypatch):
    from pipeline.common.errors import UserError
    from pipeline.launch.submit import plan

    monkeypatch.setenv("HF_TOKEN", "hf-secret-123")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    job = plan(["train", "--set", "tracking.tracking_uri=http://alice:s3cr%40t@mlflow:5000", "--set", "train.epochs=1"],
               "http://127.0.0.1:8265", forward_env=["HF_TOKEN"])
    shown = job.entrypoint + json.dumps(job.runtime_env) + repr(job)
    assert "s3cr" not in shown and "hf-secret-123" not in shown and "alice" not in shown
    assert "--set tracking.tracking_uri=http://mlflow:5000 " in job.entrypoint
    assert job.entrypoint.count("tracking.tracking_uri") == 1 and "train.epochs=1" in job.entrypoint
    assert job.runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert job.secrets == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "s3cr@t",
                           "HF_TOKEN": "hf-secret-123"}
    with pytest.raises(UserError, match="--forward-env: NOT_SET_HERE is not set here"):
        plan(["train"], "http://127.0.0.1:8265", forward_env=["NOT_SET_HERE"])
    with pytest.raises(UserError, match="command line holds the value of HF_TOKEN"):
        plan(["train", "--set", "tracking.experiment=hf-secret-123"], "http://127.0.0.1:8265", forward_env=["HF_TOKEN"])


def test_plan_redacts_a_password_of_every_printable_character_and_forwards_the_login_here(monkeypatch):
    """Whether in the tracking URI (MLFLOW_TRACKING_URI, or --set quoted as YAML reads it) or in MLflow's login
    variables, the password reaches the job only as a forwarded secret, whatever characters it holds."""
    import random
    import string

    from pipeline.launch.submit import plan

    chars = list(string.printable.strip(string.whitespace[1:]) + " ")
    random.Random(11).shuffle(chars)
    password = "".join(chars)
    uri = f"http://alice:{password}@mlflow.example:5000"
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    from_variable = plan(["train"], "http://127.0.0.1:8265")
    from_set = plan(["train", "--set", f"tracking.tracking_uri={json.dumps(uri)}"], "http://127.0.0.1:8265")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    from_login = plan(["train"], "http://127.0.0.1:8265")
    for job in (from_variable, from_set, from_login):
        shown = job.entrypoint + json.dumps(job.runtime_env) + repr(job)
        assert password not in shown and password[:8] not in shown
        assert job.runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == "http://mlflow.example:5000"
        assert job.secrets == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": password}
        # Who submits it, from which commit: plain values for the job's runs to carry.
        assert job.runtime_env["env_vars"]["NMT_SUBMITTED_BY"].partition("@")[0] and \
            job.runtime_env["env_vars"]["NMT_GIT_COMMIT"]


def test_forwarded_variables_are_set_by_the_command_and_the_setup_hook_in_a_job_and_not_by_an_import(tmp_path):
    """`nmt` (the job's driver) and the worker setup hook (every Ray worker of the job) set them; importing the
    pipeline changes no environment."""
    import importlib

    from pipeline.launch import job_env

    package = job_env.write_package({"NMT_FORWARDED_PROBE": "value-42", "NMT_STATE_KEY": "k" * 64}, tmp_path)
    assert oct(os.stat(package / job_env.VARIABLES_FILE).st_mode & 0o777) == "0o600"
    module, _, function = job_env.SETUP_HOOK.rpartition(".")
    assert getattr(importlib.import_module(module), function) is job_env.apply_in_worker  # the name Ray imports
    probe = textwrap.dedent("""
        import os, sys
        import pipeline
        before = os.environ.get("NMT_FORWARDED_PROBE")  # after the import: None
        if sys.argv[1:]:  # as the job's driver: the command
            from pipeline.cli import main
            main(["config", "--keys"])
        else:  # as a worker of the job: Ray calls the setup hook
            from pipeline.launch import job_env
            job_env.apply_in_worker()
        print(before, os.environ.get("NMT_FORWARDED_PROBE"), "NMT_STATE_KEY" in os.environ, file=sys.stderr)
    """)
    env = {**_clean_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}  # as Ray puts py_modules on the path
    for args, key in (([], False), (["--by-the-command"], True)):  # a sweep's key: the driver's alone
        inside = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env,
                                timeout=60)
        assert inside.stderr.strip().splitlines()[-1] == f"None value-42 {key}", inside.stderr[-2000:]
    outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_clean_env(),
                             cwd=ROOT, timeout=60)
    assert outside.stderr.strip().splitlines()[-1] == "None None False", outside.stderr[-2000:]


@pytest.mark.slow
def test_forwarded_secrets_leave_no_trace_in_the_job_record_or_on_the_cluster(cluster, tmp_path):
    """Two jobs with the same secret: their records differ and hold nothing of it; once they end, no file of the
    cluster's session (its nodes' runtime_env caches, logs) holds it either."""
    value = secrets.token_hex(16)
    env = {**cluster.env, "NMT_PROBE_SECRET": value, "RAY_AUTH_TOKEN": cluster.token}
    command = ["--address", cluster.address, "--no-pip", "--follow", "--forward-env", "NMT_PROBE_SECRET", "--",
               "prepare", "--set", "data.source=demo", "--set", "data.vocab_size=200",
               "--set", "data.demo_sizes={train: 300, validation: 20, test: 20}",
               "--set", f"data.output_dir={tmp_path / 'data'}"]
    records = []
    for _ in range(2):
        result = _submit(command, env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "forwarded variables" not in result.stdout, result.stdout[-3000:]  # each node deleted its copy
        job_id = next(line.split()[2] for line in result.stderr.splitlines() if "] job raysubmit_" in line
                      and " submitted to " in line)
        records.append(_job(cluster, job_id))
    uris = [record["runtime_env"]["py_modules"][0] for record in records]
    assert uris[0] != uris[1] and value not in json.dumps(records)
    holding = subprocess.run(["grep", "-rl", "--binary-files=text", value, str(cluster.root)],
                             capture_output=True, text=True).stdout.split()
    assert not holding, holding
