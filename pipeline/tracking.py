"""MLflow tracking: the one module that imports mlflow (besides the packaged model's own file)."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .errors import UserError

RUN_NAME_TAG = "nmt.run_name"  # finds a run again on resume instead of creating a duplicate
STEP_KEYS = ("step",)


def resolve_tracking_uri(configured: str = "") -> str:
    """tracking.tracking_uri, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory.

    A relative SQLite path is made absolute: Ray actors that log metrics run elsewhere.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when an MLflow server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as response:
            if response.status == 200:
                return
    except (urllib.error.URLError, OSError) as err:
        raise UserError(f"MLflow tracking server {uri} is unreachable ({err}); start it or fix "
                        f"MLFLOW_TRACKING_URI / tracking.tracking_uri") from None
    raise UserError(f"MLflow tracking server {uri} answered /health with an error")


def git_commit() -> str:
    """The project's git commit, or "unknown" outside a checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def start_run(uri: str, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
              parent_run_id: str | None = None) -> str:
    """The id of the MLflow run for run_name: the existing one when resuming, else a new one."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    existing = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
                                  max_results=1)
    if existing:
        run_id = existing[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
    all_tags = {RUN_NAME_TAG: run_name, "mlflow.runName": run_name, **tags}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
    items = sorted(params.items())
    for start in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
        client.log_batch(run.info.run_id, params=[
            mlflow.entities.Param(k, str(v)[:6000]) for k, v in items[start: start + 100]])
    return run.info.run_id


def log_metrics(uri: str, run_id: str, metrics: dict[str, Any]) -> None:
    """Log the numeric metrics of one report at its step."""
    import time

    import mlflow
    from mlflow.tracking import MlflowClient

    step = int(metrics.get("step", 0))
    now = int(time.time() * 1000)
    entries = [mlflow.entities.Metric(k, float(v), now, step) for k, v in metrics.items()
               if k not in STEP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)]
    if entries:
        MlflowClient(uri).log_batch(run_id, metrics=entries)


def log_artifacts(uri: str, run_id: str, paths: list[str | Path], artifact_path: str | None = None) -> None:
    """Copy files into the run's artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path)


def end_run(uri: str, run_id: str, status: str = "FINISHED", tags: dict[str, str] | None = None) -> None:
    """Mark the run finished (or FAILED / KILLED), with any last tags."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status=status)


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of a metric, in step order."""
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def report_callback(uri: str, run_id: str):
    """A Ray Train callback, run on the controller, that logs rank 0's reports to MLflow (one place)."""
    from ray.train import UserCallback

    class MLflowReportCallback(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            if metrics:
                log_metrics(uri, run_id, metrics[0])

    return MLflowReportCallback()
