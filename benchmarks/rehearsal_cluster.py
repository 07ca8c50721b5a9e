"""The shared cluster of benchmarks/cluster_rehearsal.py, stood up on this machine: servers, nodes and a laptop.

A Ray head and worker nodes started with `ray start`, each a process tree in a mount namespace of
its own (`unshare -m`) where the other nodes', the laptop's and the servers' directories are empty
read-only tmpfs mounts. moto's S3 server is the only storage they share; `mlflow server --app-name
basic-auth` on a throwaway PostgreSQL is the team's tracking server, with a person's login (trainer),
the read-only serving login and the promoting login (deploy/mlflow_users.py). Needs root (mount
namespaces).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# mlflow_users (the team's logins) and the tests' servers
sys.path += [str(Path(__file__).resolve().parents[1] / folder) for folder in ("deploy", "tests")]
from servers import free_port  # noqa: E402

BIN = Path(sys.executable).parent
BUCKET = "team"
NODES = ("head", "w1", "w2", "w3")


def wait_http(url: str, timeout_s: float, process: subprocess.Popen | None = None, headers: dict | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args[:4]} exited with {process.returncode} before {url} answered")
        with contextlib.suppress(OSError, http.client.HTTPException):
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")


@contextlib.contextmanager
def mlflow_login(user: str, password: str):
    """MLflow's client credentials set in this process inside the block, the earlier ones put back after."""
    names = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict(zip(names, (user, password))))
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


class Rehearsal:
    """The servers, the nodes and the laptop of one rehearsal, under one short directory."""

    def __init__(self, root: Path):
        self.root = root
        self.dirs = {name: root / name for name in ("laptop", "s3", "mlflow", *NODES)}
        for path in self.dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}
        self.token = secrets.token_hex(32)
        self.password = secrets.token_urlsafe(16)  # the trainer's, on the laptop only
        self.serving_password = secrets.token_urlsafe(16)  # the Serve replicas', in the nodes' environment
        self.promoter_password = secrets.token_urlsafe(16)  # the promoting login's: on the laptop only, never a job's
        # For browsing the server afterwards and for the test's checks (owner-readable only).
        for name, secret in (("trainer", self.password), ("promoter", self.promoter_password)):
            password_file = root / f"{name}.password"
            password_file.touch(mode=0o600)
            password_file.write_text(secret)
        self.postgres = None
        self.mlflow_server = None
        self.s3 = f"http://127.0.0.1:{free_port()}"
        self.aws = {"AWS_ENDPOINT_URL": self.s3, "AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
        self.mlflow = ""
        self.dashboard = ""
        self.gcs = ""
        self.timings: dict[str, float] = {}

    def _env(self, **extra: str) -> dict[str, str]:
        """This machine's environment without Ray, MLflow or AWS settings, plus extra."""
        drop = re.compile(r"^(RAY_|MLFLOW_|AWS_)")
        env = {k: v for k, v in os.environ.items() if not drop.match(k)}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env.update(RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2", **extra)
        return env

    def _isolated(self, sees: str, argv: list[str]) -> list[str]:
        """argv in a mount namespace of its own in which every rehearsal directory but `sees` is an empty tmpfs."""
        hidden = " ".join(str(path) for name, path in self.dirs.items() if name != sees)
        # Read-only: a process that tried to write where another machine's files are fails at once.
        script = f'for d in {hidden}; do mount -t tmpfs -o ro,size=64k rehearsal "$d"; done; exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]

    def _start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "a")  # a restarted node's log follows its first attempt's
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def start_s3(self) -> None:
        """moto's S3 server and the team's bucket."""
        port = self.s3.rsplit(":", 1)[1]
        process = self._start("s3", self._isolated("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", port]),
                              self._env(), self.dirs["s3"])
        wait_http(f"{self.s3}/moto-api/", 60, process)
        import boto3

        boto3.client("s3", endpoint_url=self.s3, aws_access_key_id="rehearsal", aws_secret_access_key="rehearsal",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)

    def start_mlflow(self, model: str) -> None:
        """`mlflow server --app-name basic-auth` on PostgreSQL; artifacts proxied to the bucket; the team's logins,
        the promoting one alone managing `model`."""
        from mlflow_users import create_user, team_model
        from servers import MlflowServer, PostgresCluster

        self.postgres = PostgresCluster(durable=False)
        self.postgres.start()
        root = self.dirs["mlflow"]
        self.mlflow_server = MlflowServer(
            root, self.postgres.database("mlflow"), auth=True, auth_backend=self.postgres.database("mlflow_auth"),
            artifacts=f"s3://{BUCKET}/mlflow-artifacts", env={**self.aws, "MLFLOW_S3_ENDPOINT_URL": self.s3},
            wrap=lambda argv: self._isolated("mlflow", argv))
        self.mlflow_server.start()
        self.mlflow = self.mlflow_server.uri
        with self.mlflow_server.admin():
            for name, password in (("trainer", self.password), ("serving", self.serving_password),
                                   ("promoter", self.promoter_password)):
                create_user(self.mlflow, name, password)
            team_model(self.mlflow, model, "promoter")

    def start_node(self, name: str, num_cpus: int) -> None:
        """`ray start --block` of the head (0 CPUs: it runs drivers, as on a real cluster) or of a worker node."""
        ports = {flag: free_port() for flag in (
            "--node-manager-port", "--object-manager-port", "--metrics-export-port", "--runtime-env-agent-port",
            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port")}
        argv = [str(BIN / "ray"), "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus),
                "--temp-dir", str(self.dirs[name] / "ray"), "--object-store-memory", str(200 * 1024**2),
                "--disable-usage-stats", *(str(x) for pair in ports.items() for x in pair)]
        if name == "head":
            gcs, dashboard = free_port(), free_port()
            argv += ["--head", "--port", str(gcs), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", str(dashboard), "--ray-client-server-port", str(free_port())]
            self.gcs, self.dashboard = f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dashboard}"
        else:
            argv += ["--address", self.gcs]
        # What the cluster's nodes have from their image and secrets: bucket credentials, and the MLflow
        # server with a login of their own for Serve replicas (jobs get the submitter's login instead).
        # A lost node is noticed after 3 missed health checks a second apart (Ray's default: 5 x 3 s), so
        # the rehearsal waits seconds, not half a minute, before the run restarts.
        env = self._env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
                        RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3",
                        MLFLOW_TRACKING_URI=self.mlflow, MLFLOW_TRACKING_USERNAME="serving",
                        MLFLOW_TRACKING_PASSWORD=self.serving_password, **self.aws)
        process = self._start(name, self._isolated(name, argv), env, self.dirs[name])
        if name == "head":
            wait_http(f"{self.dashboard}/api/gcs_healthz", 240, process)

    def wait_nodes(self, count: int, joining: str, timeout_s: float = 120) -> None:
        """Until the cluster has `count` alive nodes, `joining` the last; a node that did not join is started once more.

        On a loaded machine a `ray start` can lose a race for one of its ports (picked free, taken before
        it binds): the second start gets fresh ports. Its log is in the error when it fails again.
        """
        for attempt in range(2):
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.node_count() >= count:
                    return
                if self.processes[joining].poll() is not None:
                    break  # `ray start --block` exited: the node is not coming
                time.sleep(1)
            if attempt == 0:
                self.kill_node(joining)
                self.start_node(joining, 1)
        log = (self.root / f"{joining}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"node {joining} did not join the cluster ({self.node_count()} of {count} nodes "
                           f"alive); its `ray start` said:\n{log}")

    def dashboard_get(self, path: str):
        """The dashboard's JSON answer at `path`, with the cluster's token."""
        request = urllib.request.Request(f"{self.dashboard}{path}", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def node_count(self) -> int:
        """Alive nodes as the GCS sees them (the State API), before the dashboard's node summary lists them.

        0 while the dashboard cannot answer: on a loaded machine it can drop connections as it starts.
        """
        try:
            nodes = self.dashboard_get("/api/v0/nodes")["data"]["result"]["result"]
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            return 0
        return sum(node["state"] == "ALIVE" for node in nodes)

    def alive_nodes(self) -> list[str]:
        nodes = self.dashboard_get("/nodes?view=summary")["data"]["summary"]
        return [n["raylet"]["rayletSocketName"] for n in nodes if n["raylet"].get("state") == "ALIVE"]

    def kill_node(self, name: str) -> int:
        """A machine lost: SIGKILL every process of the node at once, with no time to clean up."""
        import psutil

        process = self.processes.pop(name)
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:  # it had exited already
            tree = []
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        process.wait(30)
        return len(tree)

    def laptop(self, argv: list[str], timeout_s: float = 600, **extra: str) -> subprocess.CompletedProcess:
        """A command run from the laptop directory, which sees no node's or server's files (extra: its variables)."""
        env = self._env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, **extra)
        return subprocess.run(self._isolated("laptop", argv), capture_output=True, text=True, env=env,
                              cwd=self.dirs["laptop"], timeout=timeout_s)

    def submit(self, step: str, command: list[str], background: bool = False):
        """`nmt submit --follow -- nmt COMMAND` from the laptop; its result with the job id and seconds."""
        argv = [sys.executable, "-m", "pipeline", "submit", "--address", self.dashboard, "--follow", "--no-pip",
                "--", "nmt", *command]
        if background:
            env = self._env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
            log = open(self.root / f"{step}.out", "w")
            return subprocess.Popen(self._isolated("laptop", argv), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.dirs["laptop"], start_new_session=True)
        started = time.monotonic()
        result = self.laptop(argv)
        self.timings[step] = round(time.monotonic() - started, 1)
        (self.root / f"{step}.out").write_text(result.stdout + result.stderr)
        return result

    def job_records(self) -> list[dict]:
        """Every job as the Jobs API shows it to anyone with the cluster's token."""
        return self.dashboard_get("/api/jobs/")

    def stop(self) -> None:
        """Stop every node and server (their whole process trees), then the tracking server and its database."""
        import psutil

        for process in reversed(list(self.processes.values())):
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
                os.killpg(process.pid, signal.SIGTERM)
                _, alive = psutil.wait_procs(tree, timeout=20)
                for proc in alive:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        proc.kill()
        self.processes.clear()
        if self.mlflow_server is not None:
            self.mlflow_server.stop()
        if self.postgres is not None:
            self.postgres.stop()
