"""Throwaway servers for tests and benchmarks: a PostgreSQL cluster and `mlflow server`, on 127.0.0.1.

    with PostgresCluster() as pg:                                   # initdb + pg_ctl as an ordinary user
        with MlflowServer(root, pg.database("mlflow"), auth=True) as server:
            server.create_user("alice", password)                   # basic-auth: admin's API
            ...

The tests' session fixtures, benchmarks/tracking_load.py and the cluster rehearsal all start
their servers here, so each is started one way. The tests import it as `servers` (tests/ is on pytest's
path); the benchmarks put tests/ on theirs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from glob import glob
from pathlib import Path

BIN = Path(sys.executable).parent
INSTALL_HINT = "install PostgreSQL's server (Debian/Ubuntu: apt-get install postgresql)"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Poll url until it answers 200; RuntimeError if the process died first or time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args[:4]} exited with {process.returncode} before {url} answered")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")


def stop_tree(process: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """Stop a process started with start_new_session=True, and everything it spawned."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout_s)


def postgres_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin directory (Debian keeps them under /usr/lib/postgresql)."""
    found = sorted(glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class PostgresCluster:
    """A PostgreSQL cluster in a temporary directory, listening on 127.0.0.1 only, deleted when stopped.

    initdb and postgres refuse to run as root, so as root they run as the `postgres` user (which
    Debian's package creates). durable=False turns off fsync: fine for tests, not for measurements.
    """

    def __init__(self, durable: bool = True, max_connections: int = 300, user: str = "nmt"):
        self.bindir = postgres_bindir()
        if self.bindir is None:
            raise RuntimeError(f"PostgreSQL's initdb is not installed: {INSTALL_HINT}")
        self.durable, self.max_connections, self.user = durable, max_connections, user
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.root: Path | None = None
        self._run_as = None

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _as_owner(self) -> dict:
        """subprocess arguments that run a server binary as the cluster's owner."""
        return {"user": self._run_as, "group": pwd.getpwnam(self._run_as).pw_gid, "extra_groups": []} \
            if self._run_as else {}

    def start(self) -> None:
        """initdb, then pg_ctl start (it waits until the server accepts connections)."""
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(f"running as root, PostgreSQL needs the `postgres` user: {INSTALL_HINT}") from None
            self._run_as = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="nmt-pg-", dir="/tmp"))
        if self._run_as:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        password_file = self.root / "password"
        password_file.write_text(self.password)
        if self._run_as:
            os.chown(password_file, owner.pw_uid, owner.pw_gid)
        password_file.chmod(0o600)
        data = self.root / "data"
        subprocess.run([str(self.bindir / "initdb"), "-D", str(data), "-U", self.user, "--auth=scram-sha-256",
                        f"--pwfile={password_file}", "-E", "UTF8", "--locale=C.UTF-8"],
                       check=True, capture_output=True, text=True, timeout=120, **self._as_owner())
        password_file.unlink()
        self.port = free_port()
        settings = {"listen_addresses": "127.0.0.1", "port": self.port, "unix_socket_directories": str(self.root),
                    "max_connections": self.max_connections, "shared_buffers": "256MB"}
        if not self.durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        options = " ".join(f"-c {key}={value}" for key, value in settings.items())
        result = subprocess.run([str(self.bindir / "pg_ctl"), "start", "-w", "-t", "120", "-D", str(data),
                                 "-l", str(self.root / "server.log"), "-o", options],
                                capture_output=True, text=True, timeout=180, **self._as_owner())
        if result.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr.strip()}\n{log}")

    def connect(self, database: str = "postgres"):
        """A psycopg connection as the cluster's superuser, autocommit on."""
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                               dbname=database, autocommit=True)

    def database(self, name: str, driver: str = "psycopg") -> str:
        """Create database `name` (dropped first if it exists); its SQLAlchemy URI for MLflow, through driver."""
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"postgresql+{driver}://{self.user}:{self.password}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """pg_ctl stop (fast: open connections are closed), then delete the cluster's directory."""
        if self.root is None:
            return
        subprocess.run([str(self.bindir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(self.root / "data")],
                       capture_output=True, timeout=120, **self._as_owner())
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a backend store (sqlite:/// or postgresql+psycopg://), optionally with logins.

    auth=True runs MLflow's basic-auth app with a generated admin password; its users database is
    auth_backend (an SQLite file beside the server's directory unless given). A verified login is
    cached for auth_cache_s in each server worker, as deploy/ runs it: checking the password hash on
    every request costs a CPU core tens of requests a second.
    """

    def __init__(self, root: Path, backend: str, *, auth: bool = False, auth_backend: str | None = None,
                 artifacts: str | None = None, workers: int = 1, env: dict[str, str] | None = None,
                 extra: tuple[str, ...] = (), port: int | None = None, auth_cache_s: int = 60,
                 wrap=None):
        self.root, self.backend, self.auth, self.workers = Path(root), backend, auth, workers
        self.root.mkdir(parents=True, exist_ok=True)
        self.auth_backend = auth_backend or f"sqlite:///{self.root / 'basic_auth.db'}"
        self.artifacts = artifacts or str(self.root / "artifacts")
        self.env, self.extra, self.auth_cache_s = dict(env or {}), extra, auth_cache_s
        self.wrap = wrap or (lambda argv: argv)  # e.g. the cluster rehearsal's mount namespace around the command
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.admin_password = secrets.token_urlsafe(16)
        self.process: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = 300) -> None:
        """Start the server (again, on the same port, after stop()) and wait until /health answers."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **self.env}  # the GenAI job runner
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            env.pop(name, None)  # the client settings of whoever starts it are not the server's
        argv = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--workers", str(self.workers), "--backend-store-uri", self.backend,
                "--artifacts-destination", self.artifacts, *self.extra]
        if self.auth:
            config = self.root / "basic_auth.ini"
            config.write_text("[mlflow]\ndefault_permission = READ\n"
                              f"database_uri = {self.auth_backend}\nadmin_username = admin\n"
                              "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                              f"auth_cache_ttl_seconds = {self.auth_cache_s}\n")
            config.chmod(0o600)  # it names the users database, with its password for PostgreSQL
            # The auth app's CSRF key: kept for a restart of the same server.
            self.env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(32))
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(config), MLFLOW_AUTH_ADMIN_PASSWORD=self.admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY=self.env["MLFLOW_FLASK_SERVER_SECRET_KEY"])
            argv += ["--app-name", "basic-auth"]
        self._log = open(self.root / "server.log", "a")
        self.process = subprocess.Popen(self.wrap(argv), stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                        cwd=self.root, start_new_session=True)
        try:
            wait_http(f"{self.uri}/health", timeout_s, self.process)
        except RuntimeError as err:
            self.stop()
            log = (self.root / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{err}; the server said:\n{log}") from None

    def stop(self) -> None:
        """Stop the server and every worker it started."""
        if self.process is not None:
            stop_tree(self.process)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    @contextlib.contextmanager
    def admin(self):
        """MLflow's auth client logged in as the admin (inside the block only)."""
        from mlflow.server import get_app_client

        names = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=self.admin_password)
        try:
            yield get_app_client("basic-auth", tracking_uri=self.uri)
        finally:
            for name, value in saved.items():
                os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
