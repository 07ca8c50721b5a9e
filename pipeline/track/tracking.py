"""MLflow tracking: the one module that imports mlflow (besides the packaged model's own file)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common import log
from ..common.environment import environment
from ..common.errors import UserError

logger = log.get("mlflow")

RUN_NAME_TAG = "nmt.run_name"  # finds a run again on resume instead of creating a duplicate
TRIAL_TAG = "nmt.trial_id"  # a trial's child run, found again from Tune's results
STEP_KEYS = ("step", "time")  # where a report's values belong, not values themselves
# Report values for the loop's own checks (replicas in sync, checkpoints averaged): not metrics to chart.
INTERNAL_KEYS = ("param_checksum", "averaged")
PROGRESS_KEY = "progress_values"  # a report's earlier progress values (each a dict with step and time)
# MLflow's variables for a server with logins (and its TLS settings): read by every MLflow client.
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                        "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH",
                        "MLFLOW_TRACKING_CLIENT_CERT_PATH")
FINAL_KEY = "final"  # True on a run's last report: metrics still held back must reach MLflow now
NODE_KEY = "node_metrics"  # any rank's report: samples of its node's system metrics, [{time, step, name: value}]
LOGIN_VARIABLES = CREDENTIAL_VARIABLES[:3]  # the login itself: user and password, or a token
# scheme://userinfo@: the userinfo runs to the last @ before the host ends (a password may hold an @).
# It ends at whitespace or a character no URI holds (" < > \), so an e-mail address beside a URI stays.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#\"<>\\]*)@")


def redact(text: str) -> str:
    """text with every URI's login hidden (user:***@, or ***@ for a token): for messages, params, tags, configs."""
    return _USERINFO.sub(_hide_login, text)


def _hide_login(match: re.Match) -> str:
    user, colon, _ = match[2].partition(":")
    return f"{match[1]}{user}:***@" if colon else f"{match[1]}***@"


def redacted(tree: Any) -> Any:
    """A config tree (dicts, lists, strings) with redact() applied to every string: what Ray may show or store."""
    if isinstance(tree, dict):
        return {key: redacted(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(redacted(value) for value in tree)
    return redact(tree) if isinstance(tree, str) else tree


def split_credentials(uri: str) -> tuple[str, dict[str, str]]:
    """(uri without its login, MLflow's variables for it): user:password@ is a user and password, token@ a token."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri, {}
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, colon, password = userinfo.partition(":")
    names = ({"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password} if colon
             else {"MLFLOW_TRACKING_TOKEN": user})
    return parts._replace(netloc=host).geturl(), {k: urllib.parse.unquote(v) for k, v in names.items() if v}


def configured_tracking_uri(configured: str = "") -> str:
    """tracking.tracking_uri, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory.

    A relative SQLite path is made absolute: Ray actors that log metrics run elsewhere. A login in
    the URI stays in it (`nmt submit` forwards it apart); commands use resolve_tracking_uri.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def resolve_tracking_uri(configured: str = "") -> str:
    """configured_tracking_uri() without its login, which moves into MLflow's login variables of this process.

    MLflow writes the tracking URI into its error messages, and those reach logs and Tune's error
    files; it never prints its variables. Ray actors get them through credentials().
    """
    uri, login = split_credentials(configured_tracking_uri(configured))
    if login:
        # The URI's login is the one meant: another one left in the variables would take precedence in MLflow.
        for name in LOGIN_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(login)
        if not configured:  # processes started from here (a local Ray) would inherit the password in it
            os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def mlflow_client(uri: str):
    """The MLflow client of a tracking URI (its registry at the same URI): the one place one is made."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri, registry_uri=uri)


def connect(configured: str = "") -> str:
    """The tracking URI resolved (resolve_tracking_uri) and checked to answer (check_reachable): what commands use."""
    uri = resolve_tracking_uri(configured)
    check_reachable(uri)
    return uri


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


@functools.cache  # the checkout does not change under a running process; a run start asks twice
def git_commit() -> str:
    """The project's git commit, or "unknown" outside a checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def standard_tags(source: str) -> dict[str, str]:
    """MLflow's own tags for who ran what from which commit: the UI's User, Source and Version columns."""
    import getpass

    from mlflow.utils import mlflow_tags

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = "unknown"
    tags = {mlflow_tags.MLFLOW_USER: user, mlflow_tags.MLFLOW_SOURCE_NAME: source,
            mlflow_tags.MLFLOW_SOURCE_TYPE: "LOCAL"}
    if (commit := git_commit()) != "unknown":
        tags[mlflow_tags.MLFLOW_GIT_COMMIT] = commit
    return tags


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps artifacts: with an SQLite store, mlruns/ beside the database.

    MLflow's default there is ./mlruns of whatever directory the command runs in, so `nmt demo
    --workdir DIR` would leave its artifacts in the current directory. Elsewhere the store (an
    MLflow server's --artifacts-destination) decides: None.
    """
    if not uri.startswith("sqlite:///"):
        return None
    return str(Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns")


@dataclass
class Run:
    """One MLflow run (its tracking URI and id): what the track/ functions log to."""

    uri: str
    id: str
    end_status: str = field(default="FINISHED", compare=False)  # how mlflow_run ends it when its block ends
    end_tags: dict[str, str] = field(default_factory=dict, compare=False)  # and the last tags it sets then

    def client(self):
        """The MLflow client of the run's store."""
        return mlflow_client(self.uri)

    def log_artifacts(self, paths: list[str | Path], artifact_path: str | None = None) -> None:
        """Copy files into the run's artifacts."""
        client = self.client()
        for path in paths:
            client.log_artifact(self.id, str(path), artifact_path)

    def log_datasets(self, datasets: list[dict[str, Any]]) -> None:
        """Record datasets as the run's inputs (the UI's Datasets column); each dict: name, digest, source,
        context, profile. Logging the same ones again (a resumed run) adds nothing."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [DatasetInput(Dataset(name=d["name"], digest=d["digest"][:36],
                                       source_type="s3" if d["source"].startswith("s3://") else "local",
                                       source=json.dumps({"uri": d["source"]}), profile=json.dumps(d["profile"])),
                               tags=[InputTag("mlflow.data.context", d["context"])]) for d in datasets]
        self.client().log_inputs(self.id, datasets=inputs)

    def log_entries(self, entries: list) -> None:
        """Log MLflow Metric entries (at their own steps and times), a batch of at most 1000 at a time."""
        client = self.client()
        for start in range(0, len(entries), 1000):
            client.log_batch(self.id, metrics=entries[start: start + 1000])

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        """(step, value) pairs of a metric, in step order."""
        return sorted((m.step, m.value) for m in self.client().get_metric_history(self.id, key))

    def end_after_error(self, status: str) -> None:
        """end(status) on the way out of an error, which it must not hide: a failure to end it is only a warning."""
        try:
            self.end(status)
        except Exception as err:  # the store may be what failed
            logger.warning(f"could not mark MLflow run {self.id} {status} ({error_line(err)}); it stays RUNNING")

    def end(self, status: str = "FINISHED", tags: dict[str, str] | None = None) -> None:
        """Mark the run ended (FINISHED, FAILED or KILLED), with any last tags: mlflow_run's, or a stopped trial's."""
        client = self.client()
        for key, value in (tags or {}).items():
            client.set_tag(self.id, key, redact(value))
        client.set_terminated(self.id, status=status)


def open_run(uri: str, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
             parent_run_id: str | None = None, source: str = "nmt", adopt_run_id: str | None = None) -> Run:
    """The MLflow run for run_name, RUNNING: the existing one when resuming, else a new one (mlflow_run ends it).

    `source` is the command that made the run (e.g. "nmt train"), shown as the run's Source.
    `adopt_run_id` is a run made for this command by someone else (`mlflow run` sets MLFLOW_RUN_ID):
    it becomes the run, instead of a new one, when it is in this tracking store.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = (found.experiment_id if found else
                     client.create_experiment(experiment, artifact_location=artifact_location(uri)))
    existing = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
                                  max_results=1)
    if existing:
        run_id = existing[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return Run(uri, run_id)
    all_tags = {**standard_tags(source), RUN_NAME_TAG: run_name, "mlflow.runName": run_name,
                **{key: redact(value) for key, value in tags.items()}}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    adopted = None
    if adopt_run_id:
        try:
            adopted = client.get_run(adopt_run_id)
        except MlflowException:
            logger.warning(f"MLFLOW_RUN_ID {adopt_run_id} is not a run of {redact(uri)}; starting a run of its own")
    if adopted is None:
        run_id = client.create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id
    else:  # its maker's source tags (`mlflow run`: the project and entry point) stay
        run_id = adopted.info.run_id
        client.log_batch(run_id, tags=[mlflow.entities.RunTag(k, v) for k, v in all_tags.items()
                                       if not (k.startswith("mlflow.source.") and k in adopted.data.tags)])
    items = sorted(params.items())
    for start in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
        client.log_batch(run_id, params=[
            mlflow.entities.Param(k, redact(str(v))[:6000]) for k, v in items[start: start + 100]])
    return Run(uri, run_id)


@contextlib.contextmanager
def mlflow_run(uri: str, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
               parent_run_id: str | None = None, source: str = "nmt", adopt_run_id: str | None = None):
    """The one place a run starts and ends: open_run(...) for the block, then FINISHED, KILLED (Ctrl-C) or FAILED.

    The block sets run.end_tags (and run.end_status, e.g. KILLED for a rejected trial) for a normal end.
    A SystemExit leaves the run RUNNING: that is Tune stopping a trial (ASHA); the sweep's summary marks
    its trials' early stops. The driver turns Ray Train's own Ctrl-C exit into KeyboardInterrupt first.
    """
    run = open_run(uri, experiment, run_name, params, tags, parent_run_id, source, adopt_run_id)
    try:
        yield run
    except KeyboardInterrupt:
        run.end_after_error("KILLED")
        raise
    except Exception:
        run.end_after_error("FAILED")
        raise
    run.end(run.end_status, run.end_tags)


def error_line(err: Exception) -> str:
    """An error's first line for a one-line message: redacted, then cut at 300 characters; its type if empty."""
    text = str(err).strip()
    return redact(text.splitlines()[0])[:300] if text else type(err).__name__


def credentials() -> dict[str, str]:
    """MLflow's variables as set here (the URI's login among them: resolve_tracking_uri): what Ray actors need."""
    return {name: os.environ[name] for name in CREDENTIAL_VARIABLES if name in os.environ}


def use_credentials(values: dict[str, str]) -> None:
    """Set credentials() of the driver in this process (a Ray actor: it has the environment of its node)."""
    os.environ.update(values)
