"""Shared fixtures: one local Ray instance for the whole session, the Multi30k location."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

# The servers the tests start (tests/servers.py: PostgreSQL, `mlflow server`); the team's logins are
# deploy/mlflow_users.py's, importable by pytest's `pythonpath` (pyproject.toml), as tools/ is.
import servers
from servers import MlflowServer, PostgresCluster, free_port  # noqa: F401 (tests import free_port from here)

from pipeline.common.environment import environment  # noqa: F401 (tests import it from here)

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Fixtures that start servers or train models: a test using one is slow, and `make test-fast` skips it.
HEAVY_FIXTURES = {"champion", "mlflow_server", "mlflow_auth_server", "cluster", "service", "s3_bucket", "postgres",
                  "ray_session", "ray_dashboard"}


def _cuda_test_device() -> str:
    """Where `cuda` tests run: NMT_TEST_DEVICE (cpu only checks the tests themselves), else the GPU."""
    return os.environ.get("NMT_TEST_DEVICE", "cuda")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(items):
    """Skip `cuda` tests without a GPU; refuse a heavy-fixture test without the slow mark (test-fast stays fast)."""
    cuda_tests = [item for item in items if item.get_closest_marker("cuda")]
    if cuda_tests and _cuda_test_device() == "cuda":
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason=f"needs a CUDA GPU (torch {torch.__version__} sees none)")
            for item in cuda_tests:
                item.add_marker(skip)
    unmarked = [item.nodeid for item in items
                if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow")
                and not item.get_closest_marker("rehearse")]
    if unmarked:
        raise pytest.UsageError(f"mark these tests @pytest.mark.slow (they use {sorted(HEAVY_FIXTURES)}): {unmarked}")


@pytest.fixture
def device():
    """The torch device of a `cuda` test."""
    import torch

    return torch.device(_cuda_test_device())


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


def multi30k_path() -> pathlib.Path | None:
    """Multi30k's folder: NMT_MULTI30K_DIR when set, else ../shared/data/multi30k, else data/multi30k (`make data`)."""
    configured = os.environ.get("NMT_MULTI30K_DIR")
    candidates = [pathlib.Path(configured)] if configured else [ROOT.parent / "shared" / "data" / "multi30k",
                                                                 ROOT / "data" / "multi30k"]
    return next((path for path in candidates if (path / "train.en").is_file() and (path / "train.de").is_file()), None)


def require_multi30k() -> pathlib.Path:
    """multi30k_path(), else skip with how to get it; under CI=true fail instead (CI always has the corpus)."""
    path = multi30k_path()
    if path is None:
        configured = os.environ.get("NMT_MULTI30K_DIR")
        where = f"NMT_MULTI30K_DIR={configured}" if configured else "../shared/data/multi30k or data/multi30k"
        message = f"Multi30k not found in {where}: run `make data` or set NMT_MULTI30K_DIR to a copy"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def multi30k_dir() -> pathlib.Path:
    """The Multi30k corpus (see require_multi30k)."""
    return require_multi30k()


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one (Ray is heavy on 2 cores)."""
    import logging

    import ray

    if not ray.is_initialized():
        # The dashboard serves the State API, which Ray Train's placement-group cleaner needs to
        # free the CPUs of a trial that ASHA stops early, and the Jobs API that `nmt submit` uses.
        # "local": a new instance even while a background job's `ray start` cluster runs on this machine.
        # A submitted job's entrypoint runs `python` from the node's PATH: this interpreter's, as on a node.
        venv = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with environment(PATH=venv):
            context = ray.init(address="local", num_cpus=2, include_dashboard=True, logging_level=logging.WARNING)
        _RAY_SESSION["dashboard"] = f"http://{context.dashboard_url}"
    yield ray
    ray.shutdown()


_RAY_SESSION: dict[str, str] = {}


@pytest.fixture(scope="session")
def ray_dashboard(ray_session):
    """The session's Ray as `nmt submit` reaches a cluster: its dashboard (at 127.0.0.1), the auth token Ray made
    for it (Ray 2.60 requires one of a local instance), and its session directory (logs, runtime_env files)."""
    import types

    session_dir = ray_session._private.worker._global_node.get_session_dir_path()
    return types.SimpleNamespace(address=_RAY_SESSION["dashboard"], session_dir=pathlib.Path(session_dir),
                                 token_file=pathlib.Path.home() / ".ray" / "auth_token")


# A local S3-compatible server (moto) stands in for object storage. Its address and test
# credentials are in the environment from the start, before any Ray instance: Ray workers
# inherit the environment their node started with, and pyarrow, Ray Train and boto3 all read
# AWS_ENDPOINT_URL. No test can reach a real bucket.
S3_ENDPOINT = f"http://127.0.0.1:{free_port()}"
os.environ.update(AWS_ENDPOINT_URL=S3_ENDPOINT, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                  AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
    os.environ.pop(_name, None)

# Ray Train's controller polls its workers every 2 s by default, so a finished run waits up to 2 s
# before shutting down, and then again for the worker group to stop. The suite runs about 40 short
# fits; polling every 0.2 s saves about 2 s on each (measured: fit 14.5 -> 12.5 s). Like the S3
# settings, every Ray instance and subprocess of the session inherits it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")


@pytest.fixture(scope="session")
def s3_bucket():
    """A bucket on the session's local S3 server, as an s3:// URI."""
    import boto3  # moto[server] and boto3 come with the dev extras
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(S3_ENDPOINT.rsplit(":", 1)[1]), verbose=False)
    server.start()
    boto3.client("s3").create_bucket(Bucket="nmt-test")
    yield "s3://nmt-test"
    server.stop()


def wait_http(url: str, timeout_s: float, process=None) -> None:
    """Poll url until it answers 200; fail the test if the process died first or time ran out."""
    try:
        servers.wait_http(url, timeout_s, process)
    except RuntimeError as err:
        pytest.fail(str(err))


stop_process = servers.stop_tree  # stops a process started with start_new_session=True, and its children


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL cluster on 127.0.0.1 for the session's MLflow servers (fsync off: test data only).

    The server binaries come from Debian's postgresql package, which .ci/run installs; elsewhere a
    test needing it skips without them (under CI=true it fails).
    """
    try:
        cluster = PostgresCluster(durable=False)
    except RuntimeError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(str(err))
        pytest.skip(str(err))
    with cluster:
        yield cluster


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, s3_bucket, postgres):
    """A real `mlflow server` on PostgreSQL, without logins, whose artifacts go to the session's S3 server.

    Clients upload through the server (proxied artifacts), as on a cluster whose nodes have no
    bucket credentials; only the server writes to the bucket.
    """
    import types

    root = tmp_path_factory.mktemp("mlflow-server")
    artifacts = f"{s3_bucket}/mlflow-artifacts"
    with MlflowServer(root, postgres.database("mlflow_open"), artifacts=artifacts,
                      env={"MLFLOW_S3_ENDPOINT_URL": S3_ENDPOINT}) as server:
        yield types.SimpleNamespace(uri=server.uri, root=root, process=server.process, artifacts=artifacts)


# The team on the login server: two people, the read-only login of serving, and the promoting login, which
# alone manages TEAM_MODEL (deploy/mlflow_users.py makes them, as a team's admin would).
TEAM = ("alice", "bob", "serving", "promoter")
TEAM_MODEL = "transformer-nmt-team-tests"


@pytest.fixture(scope="session")
def mlflow_auth_server(tmp_path_factory, postgres):
    """`mlflow server --app-name basic-auth` on PostgreSQL with a generated admin password and its logins:
    `trainer` (the user most tests log in as) and the team's (TEAM, each with a password of its own)."""
    import secrets
    import types

    from mlflow_users import create_user, team_model

    root = tmp_path_factory.mktemp("mlflow-auth-server")
    with MlflowServer(root, postgres.database("mlflow_team"), auth=True,
                      auth_backend=postgres.database("mlflow_team_auth")) as server:
        logins = {name: secrets.token_urlsafe(16) for name in ("trainer", *TEAM)}
        with server.admin():
            for name, password in logins.items():
                create_user(server.uri, name, password)
            team_model(server.uri, TEAM_MODEL, "promoter")
        yield types.SimpleNamespace(uri=server.uri, root=root, server=server, user="trainer",
                                    password=logins["trainer"], admin_password=server.admin_password,
                                    logins=logins, team_model=TEAM_MODEL)


@pytest.fixture(scope="session")
def champion(ray_session, mlflow_server, tmp_path_factory):
    """A small model trained with `nmt train`'s code path against the MLflow server, registered as champion."""
    import types

    from mlflow.tracking import MlflowClient
    from small import small_config

    from pipeline.train.driver import train

    workdir = tmp_path_factory.mktemp("champion")
    cfg = small_config(workdir, "train.epochs=2", "train.average_last=2", "tracking.experiment=nmt-tests",
                       "tracking.system_metrics_s=0.5", tracking_uri=mlflow_server.uri)
    outcome = train(cfg)
    assert outcome.registered is not None and outcome.registered.champion
    client = MlflowClient(mlflow_server.uri)
    return types.SimpleNamespace(
        uri=mlflow_server.uri, experiment=cfg.tracking.experiment,
        experiment_id=client.get_experiment_by_name(cfg.tracking.experiment).experiment_id,
        run_id=outcome.run_id, run_name=outcome.run_name, model_name=cfg.tracking.registered_model,
        version=outcome.registered.version, val_bleu=outcome.metrics["val_bleu"], outcome=outcome, cfg=cfg,
        workdir=workdir, artifacts=mlflow_server.artifacts)
