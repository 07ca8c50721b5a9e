"""The shared-cluster path rehearsed end to end on this machine, as an ML engineer lives it; prints JSON.

A Ray head and two worker nodes started with `ray start`, each a process tree in a mount namespace
of its own (`unshare -m`) where the other nodes' directories, the laptop's and the servers' are
empty tmpfs mounts: a node reads another's files only through Ray (the job's runtime_env) or
object storage. A local S3-compatible server (moto) is the only storage the nodes share; an
`mlflow server --app-name basic-auth` is the team's tracking server. From a "laptop" directory
that sees no node's files, through the dashboard at 127.0.0.1 (as a tunnel gives it) and with
the password in the tracking URI, `nmt submit` runs: a local store refused; prepare; train on 2
nodes, one of which is killed once a checkpoint is registered and replaced by a new node; a
2-trial tune; promote; evaluate; then `serve deploy` of the champion and one request to it.

    python benchmarks/cluster_rehearsal.py [--out result.json] [--keep DIR]

Needs root (mount namespaces); about 5 minutes on 2 cores. Prints its figures as one JSON line (--out:
everything it saw). tests/test_cluster_rehearsal.py runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BUCKET = "team"
NODES = ("head", "w1", "w2", "w3")
# The rehearsal's model and data: small enough that every stage takes seconds on a CPU.
SMALL = ["data.demo_sizes={train: 2000, validation: 60, test: 60}", "data.vocab_size=500", "model.d_model=64",
         "model.d_ff=128", "model.num_heads=4", "model.num_layers=1", "model.dropout=0.0", "train.max_tokens=1024",
         "train.warmup_steps=30", "train.log_every=5", "train.beam_size=1", "train.average_last=1",
         "train.resource_wait_s=120", "tracking.experiment=rehearsal", "tracking.system_metrics_s=0"]
CHAMPION = "models:/transformer-nmt-demo-en-de@champion"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        # For browsing the server afterwards and for the test's checks (owner-readable only).
        password_file = root / "trainer.password"
        password_file.touch(mode=0o600)
        password_file.write_text(self.password)
        self.serving_password = secrets.token_urlsafe(16)  # the Serve replicas', in the nodes' environment
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

    def start_mlflow(self) -> None:
        """`mlflow server --app-name basic-auth`; artifacts proxied to the bucket; users trainer and serving."""
        root, port = self.dirs["mlflow"], free_port()
        admin = secrets.token_urlsafe(16)
        (root / "basic_auth.ini").write_text(
            f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{root / 'basic_auth.db'}\n"
            "admin_username = admin\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        env = self._env(MLFLOW_AUTH_CONFIG_PATH=str(root / "basic_auth.ini"), MLFLOW_AUTH_ADMIN_PASSWORD=admin,
                        MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(32), MLFLOW_S3_ENDPOINT_URL=self.s3,
                        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **self.aws)
        argv = [str(BIN / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination", f"s3://{BUCKET}/mlflow-artifacts"]
        process = self._start("mlflow", self._isolated("mlflow", argv), env, root)
        self.mlflow = f"http://127.0.0.1:{port}"
        wait_http(f"{self.mlflow}/health", 300, process)
        from mlflow.server import get_app_client

        with mlflow_login("admin", admin):
            client = get_app_client("basic-auth", tracking_uri=self.mlflow)
            client.create_user("trainer", self.password)
            client.create_user("serving", self.serving_password)

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

    def laptop(self, argv: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
        """A command run from the laptop directory, which sees no node's or server's files."""
        env = self._env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
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
        """Stop every node and server (their whole process trees)."""
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


def checkpoint_registered(rehearsal: Rehearsal, prefix: str) -> bool:
    """Whether Ray Train has registered a checkpoint under s3://team/<prefix> (its checkpoint manager's snapshot)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=rehearsal.s3, aws_access_key_id="rehearsal",
                      aws_secret_access_key="rehearsal", region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return any(key.endswith("/checkpoint_manager_snapshot.json") for key in keys)


def job_id(result) -> str:
    found = re.search(r"job (raysubmit_\w+) submitted", result.stderr if hasattr(result, "stderr") else result)
    return found.group(1) if found else ""


def run(rehearsal: Rehearsal) -> dict:
    """The whole flow; returns what happened at each step, for the test and for people."""
    r, out = rehearsal, {}
    started = time.monotonic()
    r.start_s3()
    r.start_mlflow()
    r.start_node("head", 0)
    for count, name in enumerate(("w1", "w2"), start=2):
        r.start_node(name, 1)
        r.wait_nodes(count, name)
    r.timings["start_cluster"] = round(time.monotonic() - started, 1)
    tracking = r.mlflow.replace("http://", f"http://trainer:{r.password}@")
    common = ["--config", "configs/demo.yaml", *[x for s in SMALL for x in ("--set", s)],
              "--set", f"tracking.tracking_uri={tracking}", "--set", f"data.output_dir=s3://{BUCKET}/prepared"]

    # 1. What a tunnel hides: the dashboard at 127.0.0.1 is a remote cluster, so a local store is refused.
    refused = r.submit("local_store", ["train", "--config", "configs/demo.yaml"])
    probe = "import os, sys; print(sum(os.path.exists(p) for p in sys.argv[1:]))"
    seen = r.laptop([sys.executable, "-c", probe, *r.alive_nodes()], timeout_s=60).stdout.strip()
    out["local_store"] = {"exit": refused.returncode, "stderr": refused.stderr[-2000:],
                          "node_sockets_seen_from_laptop": int(seen or -1)}

    prepared = r.submit("prepare", ["prepare", *common])
    out["prepare"] = {"exit": prepared.returncode, "job": job_id(prepared), "tail": prepared.stdout[-1500:]}

    # 2. Training on the two worker nodes; w2 is lost once a checkpoint is registered, w3 joins.
    runs = f"s3://{BUCKET}/runs"
    train = ["train", *common, "--set", "train.num_workers=2", "--set", "train.placement_strategy=STRICT_SPREAD",
             "--set", "train.max_steps=60", "--set", "train.val_interval=10", "--set", "train.max_failures=2",
             "--set", f"train.storage_path={runs}", "--set", "train.run_name=rehearsal-train"]
    t0 = time.monotonic()
    process = r.submit("train", train, background=True)
    lost = {}
    deadline = time.monotonic() + 420
    while process.poll() is None and time.monotonic() < deadline:
        if not lost and checkpoint_registered(r, "runs/rehearsal-train"):
            lost = {"after_s": round(time.monotonic() - t0, 1), "processes_killed": r.kill_node("w2")}
            r.start_node("w3", 1)  # joins while the run waits for capacity; the run's own wait bounds it
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(60)
    r.timings["train"] = round(time.monotonic() - t0, 1)
    log = (r.root / "train.out").read_text()
    out["train"] = {"exit": process.returncode, "job": job_id(log), "lost_node": lost, "tail": log[-2500:]}

    tune = ["tune", *common, "--space", "tune_spaces/demo_quick.yaml", "--set", "tune.num_samples=1",
            "--set", "tune.scheduler=fifo", "--set", "train.num_workers=1", "--set", "train.max_steps=30",
            "--set", "train.val_interval=15", "--set", f"train.storage_path={runs}",
            "--set", "tune.name=rehearsal-tune"]
    tuned = r.submit("tune", tune)
    out["tune"] = {"exit": tuned.returncode, "job": job_id(tuned), "tail": tuned.stdout[-2000:]}

    # 3. The champion: version 1 (the training run's) promoted by hand, then scored on the prepared test split.
    promoted = r.submit("promote", ["promote", "1", *common])
    out["promote"] = {"exit": promoted.returncode, "job": job_id(promoted), "tail": promoted.stdout[-500:]}
    scored = r.submit("evaluate", ["evaluate", "--split", "test", "--beam", "1", *common])
    out["evaluate"] = {"exit": scored.returncode, "job": job_id(scored), "tail": scored.stdout[-800:]}

    # 4. Serving: deploy/serve_config.yaml pointed at the champion, deployed through the dashboard.
    out["serve"] = serve(r)
    out["mlflow"] = server_view(r)
    out["jobs"] = r.job_records()
    out["timings_s"] = {**r.timings, "total": round(time.monotonic() - started, 1)}
    out["tracking_uri"], out["s3"], out["root"] = r.mlflow, r.s3, str(r.root)
    return out


def server_view(r: Rehearsal) -> dict:
    """What the team sees on the tracking server afterwards, read as the trainer."""
    from mlflow.tracking import MlflowClient

    with mlflow_login("trainer", r.password):
        client = MlflowClient(r.mlflow)
        experiment = client.get_experiment_by_name("rehearsal")
        runs = client.search_runs([experiment.experiment_id])
        view = {"runs": [{"name": run.info.run_name, "status": run.info.status, "metrics": sorted(run.data.metrics),
                          "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}}
                         for run in runs]}
        train = next(run for run in runs if run.info.run_name == "rehearsal-train")
        for key in ("resumed_from_step", "val_loss"):
            view[key] = [(m.step, m.value) for m in client.get_metric_history(train.info.run_id, key)]
        champion = client.get_model_version_by_alias(CHAMPION.split("/")[-1].split("@")[0], "champion")
        view["champion"] = {"name": champion.name, "version": champion.version, "tags": champion.tags}
        view["versions"] = len(client.search_model_versions(f"name = '{champion.name}'"))
        return view


def serve(r: Rehearsal) -> dict:
    """`serve deploy` of the champion from the laptop; one translation request; `serve shutdown`."""
    config = yaml.safe_load((ROOT / "deploy" / "serve_config.yaml").read_text())
    port = free_port()
    # One machine holds every node here: the proxy runs on the head only, on loopback.
    config.update(proxy_location="HeadOnly", http_options={**config["http_options"], "host": "127.0.0.1", "port": port})
    app = config["applications"][0]
    app["args"]["model_uri"] = CHAMPION
    deployment = app["deployments"][0]
    deployment["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 1, "initial_replicas": 1}
    deployment["ray_actor_options"]["num_cpus"] = 1
    path = r.root / "serve_config.yaml"  # beside the laptop directory, which stays untouched
    path.write_text(yaml.safe_dump(config))
    t0 = time.monotonic()
    deployed = r.laptop([str(BIN / "serve"), "deploy", str(path), "--address", r.dashboard])
    result = {"deploy_exit": deployed.returncode, "deploy_output": (deployed.stdout + deployed.stderr)[-1500:]}
    if deployed.returncode == 0:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", 240)
        request = urllib.request.Request(f"{url}/translate", data=json.dumps({"texts": ["the dog sees a house ."]})
                                         .encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            result["response"] = json.loads(response.read())
        result["seconds_to_first_answer"] = round(time.monotonic() - t0, 1)
        r.laptop([str(BIN / "serve"), "shutdown", "-y", "--address", r.dashboard], timeout_s=120)
    r.timings["serve"] = round(time.monotonic() - t0, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here as well")
    parser.add_argument("--keep", help="a short directory (Unix socket paths must stay short) kept afterwards")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("cluster_rehearsal: needs root and unshare (util-linux) for its nodes' mount namespaces", file=sys.stderr)
        return 2
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nmt-rh-", dir="/tmp"))
    rehearsal = Rehearsal(root)
    try:
        result = run(rehearsal)
    finally:
        rehearsal.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary(result)))  # one line: benchmarks/run_all.py reads it
    return 0


def summary(result: dict) -> dict:
    """The figures of a rehearsal: seconds per step, the lost node, what the server and the service show."""
    runs = result["mlflow"]["runs"]
    return {"seconds": result["timings_s"], "lost_node_after_s": result["train"]["lost_node"].get("after_s"),
            "resumed_from_step": [value for _, value in result["mlflow"]["resumed_from_step"]],
            "runs_finished": f"{sum(r['status'] == 'FINISHED' for r in runs)}/{len(runs)}",
            "jobs_succeeded": f"{sum(j['status'] == 'SUCCEEDED' for j in result['jobs'])}/{len(result['jobs'])}",
            "local_store_refused": result["local_store"]["exit"] == 2,
            "champion_version": result["mlflow"]["champion"]["version"],
            "served_version": result["serve"].get("response", {}).get("model_version")}


if __name__ == "__main__":
    sys.exit(main())
