"""MLflow tracking: the one module that imports mlflow (besides the packaged model's own file)."""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..common import log
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
    from mlflow.tracking import MlflowClient

    saved = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # a refusal is final; retries only delay the message
    try:
        MlflowClient(uri).search_experiments(max_results=1)
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
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
        else:
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = saved


def _create_sqlite_store(uri: str) -> None:
    """Create (or open) an SQLite store under a file lock next to it.

    Two commands that start at once on a store that does not exist yet would both run MLflow's
    schema migrations on it, and one of them would fail; the lock makes the second one wait.
    """
    import fcntl

    from mlflow.tracking import MlflowClient

    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        client = MlflowClient(uri)
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


def start_run(uri: str, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
              parent_run_id: str | None = None, source: str = "nmt", adopt_run_id: str | None = None) -> str:
    """The id of the MLflow run for run_name: the existing one when resuming, else a new one.

    `source` is the command that made the run (e.g. "nmt train"), shown as the run's Source.
    `adopt_run_id` is a run made for this command by someone else (`mlflow run` sets MLFLOW_RUN_ID):
    it becomes the run, instead of a new one, when it is in this tracking store.
    """
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = (found.experiment_id if found else
                     client.create_experiment(experiment, artifact_location=artifact_location(uri)))
    existing = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
                                  max_results=1)
    if existing:
        run_id = existing[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
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
    return run_id


def _metric_entries(report: dict[str, Any]) -> list:
    """The numeric values of a report, and of the earlier progress values it carries, at their steps and times."""
    import time

    import mlflow

    now = time.time()
    # NaN marks a value that does not exist (the val_bleu of a checkpoint taken on a preemption notice).
    return [mlflow.entities.Metric(_chart_name(k, row), float(v), int(row.get("time", now) * 1000),
                                   int(row.get("step", 0)))
            for row in [*report.get(PROGRESS_KEY, ()), report] for k, v in row.items()
            if k not in STEP_KEYS + INTERNAL_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]


def _chart_name(key: str, row: dict[str, Any]) -> str:
    """A metric's MLflow name: the averaged checkpoint's scores get their own (val_bleu_averaged, ...), so that
    a learning curve shows the training run and does not end in another model's figure."""
    return f"{key}_averaged" if "averaged" in row and key.startswith("val_") else key


def node_metric_entries(reports: list[dict[str, Any]]) -> list:
    """The node samples (system/<node>/<metric>) that the ranks' reports carry, at their steps and times."""
    import mlflow

    return [mlflow.entities.Metric(k, float(v), int(sample["time"] * 1000), int(sample.get("step", 0)))
            for report in reports for sample in report.get(NODE_KEY, ()) for k, v in sample.items()
            if k not in STEP_KEYS and isinstance(v, (int, float)) and math.isfinite(v)]


def restart_tags(report: dict[str, Any]) -> dict[str, str]:
    """A tag per restart that a report (or its earlier values) tells of: restart.<n> = why, where, how many workers."""
    return {f"restart.{row['restarts']}": f"{row['restart_cause']} at step {row['resumed_from_step']}, "
                                          f"{row['restart_from_workers']} -> {row['world_size']} workers"
            for row in [*report.get(PROGRESS_KEY, ()), report] if "restart_cause" in row}


def log_metrics(uri: str, run_id: str, metrics: dict[str, Any]) -> None:
    """Log the numeric metrics of one report at its step."""
    from mlflow.tracking import MlflowClient

    entries = _metric_entries(metrics)
    if entries:
        MlflowClient(uri).log_batch(run_id, metrics=entries)


def _reason(err: Exception) -> str:
    """The start of an error's message, for a log line: redacted before it is cut, which could split a URI's login."""
    return redact(str(err))[:200]


def error_line(err: Exception) -> str:
    """An error's first line for a one-line message: redacted, then cut at 300 characters; its type if empty."""
    text = str(err).strip()
    return redact(text.splitlines()[0])[:300] if text else type(err).__name__


class MetricLogger:
    """Logs reports to MLflow without ever failing training: while the store is unreachable, reports
    wait in a bounded buffer (with their original timestamps) and go out once it answers again."""

    MAX_PENDING = 100_000  # metric entries; beyond it the oldest are dropped, and the gap is reported
    BATCH = 1000  # MLflow's limit of metrics per log_batch call
    FINAL_WAIT_S = 120.0  # after the last report no later one will retry: wait this long for the store

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id = uri, run_id
        self.pending: list = []
        self.pending_tags: list = []
        self.dropped = 0
        self.failing_since: float | None = None

    def log(self, report: dict[str, Any], extra: list | None = None, tags: dict[str, str] | None = None) -> None:
        """Queue one report's metrics and send everything queued; keep what fails for the next report.

        The last report of a run (FINAL_KEY) retries for up to FINAL_WAIT_S: training is over, and
        nothing after it would deliver what is still queued.
        """
        import time

        import mlflow

        self.pending.extend([*_metric_entries(report), *(extra or [])])
        self.pending_tags.extend(mlflow.entities.RunTag(k, v) for k, v in (tags or {}).items())
        if len(self.pending) > self.MAX_PENDING:
            self.dropped += len(self.pending) - self.MAX_PENDING
            del self.pending[: len(self.pending) - self.MAX_PENDING]
        deadline = time.monotonic() + (self.FINAL_WAIT_S if report.get(FINAL_KEY) else 0.0)
        while not self._send() and time.monotonic() < deadline:
            time.sleep(2.0)
        if self.pending and report.get(FINAL_KEY):
            logger.warning(f"{redact(self.uri)} did not answer within {self.FINAL_WAIT_S:.0f}s after training: "
                           f"{len(self.pending)} metric values were not logged")

    def _send(self) -> bool:
        """Send everything queued; False (and a warning when an outage starts) if the store fails."""
        import time

        from mlflow.tracking import MlflowClient

        sent = 0
        try:
            client = MlflowClient(self.uri)
            if self.pending_tags:
                client.log_batch(self.run_id, tags=self.pending_tags)
                self.pending_tags = []
            while self.pending:
                client.log_batch(self.run_id, metrics=self.pending[: self.BATCH])
                sent += min(self.BATCH, len(self.pending))
                del self.pending[: self.BATCH]
        except Exception as err:  # any store failure: training must go on
            if self.failing_since is None:
                self.failing_since = time.monotonic()
                logger.warning(f"cannot log metrics to {redact(self.uri)} ({type(err).__name__}: {_reason(err)}); "
                               "training goes on and the metrics are kept until MLflow answers again")
            return False
        if self.failing_since is not None:
            lost = f"; {self.dropped} metric values were dropped (buffer full)" if self.dropped else ""
            logger.warning(f"{redact(self.uri)} answers again after {time.monotonic() - self.failing_since:.0f}s: "
                           f"logged {sent} delayed metric values{lost}")
            self.failing_since, self.dropped = None, 0
        return True


def log_datasets(uri: str, run_id: str, datasets: list[dict[str, Any]]) -> None:
    """Record datasets as the run's inputs (the UI's Datasets column); each dict: name, digest, source, context,
    profile. Logging the same ones again (a resumed run) adds nothing."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    inputs = [DatasetInput(Dataset(name=d["name"], digest=d["digest"][:36],
                                   source_type="s3" if d["source"].startswith("s3://") else "local",
                                   source=json.dumps({"uri": d["source"]}), profile=json.dumps(d["profile"])),
                           tags=[InputTag("mlflow.data.context", d["context"])]) for d in datasets]
    MlflowClient(uri).log_inputs(run_id, datasets=inputs)


def log_artifacts(uri: str, run_id: str, paths: list[str | Path], artifact_path: str | None = None) -> None:
    """Copy files into the run's artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path)


def log_best(uri: str, run_id: str, val_bleu: float, step: int) -> None:
    """best_val_bleu and best_step: the run's best validation, the figure its tables and plots should show."""
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).log_batch(run_id, metrics=[_metric("best_val_bleu", val_bleu, step),
                                                 _metric("best_step", float(step), step)])


def _metric(key: str, value: float, step: int):
    import time

    import mlflow

    return mlflow.entities.Metric(key, float(value), int(time.time() * 1000), int(step))


def end_run(uri: str, run_id: str, status: str = "FINISHED", tags: dict[str, str] | None = None) -> None:
    """Mark the run finished (or FAILED / KILLED), with any last tags."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, redact(value))
    client.set_terminated(run_id, status=status)


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of a metric, in step order."""
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def credentials() -> dict[str, str]:
    """MLflow's variables as set here (the URI's login among them: resolve_tracking_uri): what Ray actors need."""
    return {name: os.environ[name] for name in CREDENTIAL_VARIABLES if name in os.environ}


def use_credentials(values: dict[str, str]) -> None:
    """Set credentials() of the driver in this process (a Ray actor: it has the environment of its node)."""
    os.environ.update(values)


def report_callback(uri: str, run_id: str, system_metrics_s: float = 0.0):
    """A Ray Train callback, run on the controller, that logs rank 0's reports to MLflow (one place).

    With system_metrics_s > 0 it also runs MLflow's system-metrics monitor (CPU, memory, disk, network,
    GPU when present) there, from the first report to the last: the figures of the driver's node.
    """
    from ray.train import UserCallback

    login = credentials()  # carried to the controller inside the callback, not through an env var Ray shows

    class MLflowReportCallback(UserCallback):
        def __init__(self):
            self.logger = MetricLogger(uri, run_id)
            self.monitor = None

        def _watch_system(self, final: bool) -> None:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            if self.monitor is None and not final and system_metrics_s > 0:
                # Its start and stop INFO lines would reach the driver's terminal from this actor.
                logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
                self.monitor = SystemMetricsMonitor(run_id, sampling_interval=system_metrics_s, resume_logging=True,
                                                    tracking_uri=uri)
                self.monitor.start()
            elif self.monitor is not None and final:
                self.monitor.finish()

        def after_report(self, run_context, metrics, checkpoint):
            log.setup()  # this runs in Ray Train's controller process: its warnings need a handler there
            use_credentials(login)
            # This process only logs metrics: an unreachable server should cost seconds per report,
            # not MLflow's default minutes of retries that would stall the controller.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            if metrics:  # rank 0's report for the run's metrics; every rank's for its node's system metrics
                self.logger.log(metrics[0], extra=node_metric_entries(metrics), tags=restart_tags(metrics[0]))
                self._watch_system(final=bool(metrics[0].get(FINAL_KEY)))

    return MLflowReportCallback()
