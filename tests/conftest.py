"""Shared fixtures: one local Ray instance for the whole session, the Multi30k location."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Fixtures that start servers or train models: a test using one is slow, and `make test-fast` skips it.
HEAVY_FIXTURES = {"champion", "mlflow_server", "cluster", "service"}


def pytest_collection_modifyitems(items):
    """Refuse a test that uses a heavy fixture without the slow mark: it would make `make test-fast` slow."""
    unmarked = [item.nodeid for item in items
                if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow")]
    if unmarked:
        raise pytest.UsageError(f"mark these tests @pytest.mark.slow (they use {sorted(HEAVY_FIXTURES)}): {unmarked}")


@pytest.fixture(scope="session", autouse=True)
def pipeline_logging():
    """Progress and warning lines on stderr, as `nmt` sets them up, for tests that call the stages directly."""
    from pipeline.common import log

    log.setup()


@pytest.fixture(scope="session", autouse=True)
def shared_prepared_data(tmp_path_factory):
    """One prepared-data directory for the session's small configs (see tests/small.py)."""
    from small import SHARED_DATA_ENV

    os.environ[SHARED_DATA_ENV] = str(tmp_path_factory.mktemp("prepared"))
    yield
    os.environ.pop(SHARED_DATA_ENV, None)


@pytest.fixture(scope="session")
def multi30k_dir() -> pathlib.Path:
    """The Multi30k corpus (NMT_MULTI30K_DIR, else ../shared/data/multi30k); CI always has it."""
    path = pathlib.Path(os.environ.get("NMT_MULTI30K_DIR", ROOT.parent / "shared" / "data" / "multi30k"))
    if not (path / "train.en").is_file():
        pytest.fail(f"Multi30k not found at {path}; set NMT_MULTI30K_DIR")
    return path


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one (Ray is heavy on 2 cores)."""
    import logging

    import ray

    if not ray.is_initialized():
        # The dashboard serves the State API, which Ray Train's placement-group cleaner needs to
        # free the CPUs of a trial that ASHA stops early.
        ray.init(num_cpus=2, include_dashboard=True, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout_s: float, process=None) -> None:
    """Poll url until it answers 200; fail with the process's exit if it died first."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            pytest.fail(f"{process.args[:3]} exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer within {timeout_s:.0f}s")


def stop_process(process, timeout_s: float = 15.0) -> None:
    """Stop a process started with start_new_session=True, and everything it spawned."""
    import signal
    import subprocess

    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout_s)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 with an SQLite store and a local artifact root, stopped afterwards."""
    import subprocess
    import sys
    import types

    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root,
        # The server's background job runner (for GenAI features) only costs start-up time here.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{uri}/health", 300, process)
        yield types.SimpleNamespace(uri=uri, root=root, process=process)
    finally:
        stop_process(process)
        log.close()


@pytest.fixture(scope="session")
def champion(ray_session, mlflow_server, tmp_path_factory):
    """A small model trained with `nmt train`'s code path against the MLflow server, registered as champion."""
    import types

    from mlflow.tracking import MlflowClient
    from small import small_config

    from pipeline.train.driver import train

    workdir = tmp_path_factory.mktemp("champion")
    cfg = small_config(workdir, "train.epochs=2", "train.average_last=2", "tracking.experiment=nmt-tests",
                       tracking_uri=mlflow_server.uri)
    outcome = train(cfg)
    assert outcome.registered is not None and outcome.registered.champion
    client = MlflowClient(mlflow_server.uri)
    return types.SimpleNamespace(
        uri=mlflow_server.uri, experiment=cfg.tracking.experiment,
        experiment_id=client.get_experiment_by_name(cfg.tracking.experiment).experiment_id,
        run_id=outcome.run_id, run_name=outcome.run_name, model_name=cfg.tracking.registered_model,
        version=outcome.registered.version, val_bleu=outcome.metrics["val_bleu"], outcome=outcome, cfg=cfg,
        workdir=workdir)
