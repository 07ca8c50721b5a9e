"""Where a process tracks: the MLflow tracking URI and its login, resolved once where the process starts.

    target = connect(cfg.tracking.tracking_uri)   # resolved, active in this process, checked to answer
    ... target.uri ...                            # what MLflow calls take (never with a login in it)
    actor_args = (target, ...)                    # a Ray actor gets it as a value and calls target.activate()

MLflow reads a login only from its variables (MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN), so the
target is activated once per process; a Ray actor has its node's environment, not the driver's,
and activates the target it was handed.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..common.environment import environment, set_for_process
from ..common.errors import UserError
from . import login as logins
from .login import Login, redact

# MLflow's TLS settings for a server: carried with the login to the processes that log.
TLS_VARIABLES = ("MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_CLIENT_CERT_PATH")
DEFAULT_URI = "sqlite:///mlflow.db"


@dataclass(frozen=True)
class TrackingTarget:
    """A tracking URI without its login, and the login (none for a local store)."""

    uri: str
    login: Login | None = None
    tls: tuple[tuple[str, str], ...] = ()  # (variable, value) of MLflow's TLS settings where it was resolved

    @property
    def is_server(self) -> bool:
        """Whether it is an MLflow server (http, https) rather than a store this process opens itself."""
        return self.uri.startswith(("http://", "https://"))

    @property
    def username(self) -> str:
        """The login's user name ("" without one, or with a token)."""
        return self.login.username if self.login else ""

    def variables(self) -> dict[str, str | None]:
        """MLflow's variables for a server: its login (the others unset: they would take precedence), TLS."""
        if not self.is_server:
            return {}
        values = (self.login or Login()).variables()
        values.update(self.tls)
        return values

    def activate(self) -> None:
        """Make this the login every MLflow client of this process uses (a process's start-up, a Ray actor's)."""
        set_for_process(self.variables())


def configured_uri(configured: str = "") -> str:
    """tracking.tracking_uri, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db, a relative SQLite path made absolute.

    Absolute because Ray actors that log metrics run in other directories. A login in the URI stays.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def resolve(configured: str = "") -> TrackingTarget:
    """The target of a command: configured_uri(), the URI's login, else the login of MLflow's variables here."""
    uri, login = logins.split_login(configured_uri(configured))
    if login is None and uri.startswith(("http://", "https://")):
        login = logins.from_variables(dict(os.environ))
    tls = tuple((name, os.environ[name]) for name in TLS_VARIABLES if name in os.environ)
    return TrackingTarget(uri, login, tls)


def connect(configured: str = "") -> TrackingTarget:
    """resolve(), activated in this process and checked to answer: what a command does where it starts.

    MLflow writes the tracking URI into its error messages, which reach logs and Tune's error files; it
    never prints its variables. So the login leaves the URI, and MLFLOW_TRACKING_URI too when it held
    one: processes started from here (a local Ray) would inherit it.
    """
    target = resolve(configured)
    target.activate()
    if not configured and target.login and logins.split_login(os.environ.get("MLFLOW_TRACKING_URI", ""))[1]:
        set_for_process({"MLFLOW_TRACKING_URI": target.uri})
    check_reachable(target.uri)
    return target


def mlflow_client(uri: str):
    """The MLflow client of a tracking URI (its registry at the same URI): the one place one is made."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri, registry_uri=uri)


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when an MLflow server does not answer; create a new SQLite store."""
    if uri.startswith("sqlite:///"):
        _create_sqlite_store(uri)
    if not uri.startswith(("http://", "https://")):
        return
    parts = urllib.parse.urlsplit(uri.rstrip("/"))
    health = parts._replace(path=f"{parts.path}/health").geturl()
    try:  # /health needs no credentials
        with urllib.request.urlopen(health, timeout=timeout_s) as response:
            healthy = response.status == 200
    except (urllib.error.URLError, OSError) as err:
        raise UserError(f"MLflow tracking server {redact(uri)} is unreachable ({redact(str(err))}); start it or fix "
                        f"MLFLOW_TRACKING_URI / tracking.tracking_uri") from None
    if not healthy:
        raise UserError(f"MLflow tracking server {redact(uri)} answered /health with an error")
    _check_credentials(uri)


def _check_credentials(uri: str) -> None:
    """One authenticated request, without retries: a server with logins refuses wrong credentials here."""
    from mlflow.exceptions import MlflowException

    try:
        with environment(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0"):  # a refusal is final; retries only delay the message
            mlflow_client(uri).search_experiments(max_results=1)
    except MlflowException as err:
        status = err.get_http_status_code()
        if status == 401:
            raise UserError(f"MLflow tracking server {redact(uri)} refused the credentials (HTTP 401): set "
                            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user of that server "
                            "(or MLFLOW_TRACKING_TOKEN)") from None
        if status == 403:
            raise UserError(f"MLflow tracking server {redact(uri)}: the user has no permission to read "
                            "experiments (HTTP 403); ask the server's admin for access") from None
        raise


def _create_sqlite_store(uri: str) -> None:
    """Create (or open) an SQLite store under a file lock next to it.

    Two commands that start at once on a store that does not exist yet would both run MLflow's
    schema migrations on it, and one of them would fail; the lock makes the second one wait.
    """
    import fcntl

    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        client = mlflow_client(uri)
        client.search_experiments(max_results=1)  # the tracking tables
        client.search_registered_models(max_results=1)  # and the registry's
