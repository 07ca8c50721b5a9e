"""An MLflow run's lifecycle: opened (or found again on resume), logged to through a Run handle, always ended."""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ..common import log
from ..common.errors import UserError
from ..common.userinfo import without_secret
from .login import redact, redact_uri
from .provenance import standard_tags
from .target import mlflow_client

logger = log.get("mlflow")

RUN_NAME_TAG = "nmt.run_name"  # finds a run again on resume instead of creating a duplicate
TRIAL_TAG = "nmt.trial_id"  # a trial's child run, found again from Tune's results
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
        """Copy files into the run's artifacts (each retried while the store fails: an upload replaces itself)."""
        client = self.client()
        for path in paths:
            retrying(partial(client.log_artifact, self.id, str(path), artifact_path), f"logging {path}", END_WAIT_S)

    def log_datasets(self, datasets: list[dict[str, Any]]) -> None:
        """Record datasets as the run's inputs (the UI's Datasets column); each dict: name, digest, source,
        context, profile. Logging the same ones again (a resumed run) adds nothing."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [DatasetInput(Dataset(name=d["name"], digest=d["digest"][:36],
                                       source_type="s3" if d["source"].startswith("s3://") else "local",
                                       source=json.dumps({"uri": without_secret(d["source"])}),
                                       profile=json.dumps(d["profile"])),
                               tags=[InputTag("mlflow.data.context", d["context"])]) for d in datasets]
        retrying(lambda: _log_inputs(self.client(), self.id, inputs), "logging the run's datasets", END_WAIT_S)

    def log_entries(self, entries: list) -> None:
        """Log MLflow Metric entries (at their own steps and times), a batch of at most 1000 at a time, each
        retried while the store fails (a value logged twice is kept once)."""
        client = self.client()
        for start in range(0, len(entries), 1000):
            batch = partial(client.log_batch, self.id, metrics=entries[start: start + 1000])
            retrying(batch, "logging metrics", END_WAIT_S)

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
        """Mark the run ended (FINISHED, FAILED or KILLED), with any last tags: mlflow_run's, or a stopped trial's.

        Retried while the server does not answer (a restart, a refusal under load): a run is not left
        RUNNING by one lost request. Both calls are idempotent.
        """
        client = self.client()

        def end_it():
            if tags:
                client.log_batch(self.id, tags=[_tag(key, redact_uri(str(value))) for key, value in tags.items()])
            client.set_terminated(self.id, status=status)

        retrying(end_it, f"marking MLflow run {self.id} {status}", END_WAIT_S)


END_WAIT_S = 120.0  # how long a run's start or end is retried while its server does not answer


def _log_inputs(client, run_id: str, inputs: list) -> None:
    """client.log_inputs, once more if another run inserted the same dataset between MLflow's check and its
    insert (two sweeps starting at once on one store): the failed call was rolled back, the second links."""
    from mlflow.exceptions import MlflowException

    try:
        client.log_inputs(run_id, datasets=inputs)
    except MlflowException as err:
        if "UNIQUE constraint failed: datasets" not in str(err) and "duplicate key" not in str(err):
            raise
        client.log_inputs(run_id, datasets=inputs)


def retrying(action, what: str, wait_s: float):
    """action(), tried again with a backoff of 1, 2, 4 ... 15 s for up to wait_s while the store fails.

    A refusal that retrying cannot change (a permission, a bad request: HTTP 4xx) is raised at once.
    """
    from mlflow.exceptions import MlflowException

    deadline, delay = time.monotonic() + wait_s, 1.0
    while True:
        try:
            return action()
        except MlflowException as err:
            status = err.get_http_status_code()
            if status and 400 <= status < 500 and status != 429:
                raise
            failure = err
        except OSError as err:  # the connection itself
            failure = err
        if time.monotonic() + delay > deadline:
            raise failure
        logger.warning(f"{what}: the store failed ({error_line(failure)}); retrying in {delay:.0f}s")
        time.sleep(delay * random.uniform(0.8, 1.2))  # apart, so that many trials do not retry in step
        delay = min(delay * 2, 15.0)


def _tag(key: str, value: str):
    import mlflow

    return mlflow.entities.RunTag(key, value)


class PermissionRefused(UserError):
    """The tracking server's login may not do this (HTTP 403)."""


def _refused(err: Exception, uri: str, doing: str, user: str) -> PermissionRefused | None:
    """A one-line error for a 403 of the tracking server, saying what was refused and what to do."""
    from mlflow.exceptions import MlflowException

    if not isinstance(err, MlflowException) or err.get_http_status_code() != 403:
        return None
    who = f"MLflow user {user!r}" if user else "this MLflow login"
    return PermissionRefused(f"{redact(uri)} refused {doing} (HTTP 403): {who} may not do it; log to an "
                             "experiment of your own (--set tracking.experiment=NAME) or ask the server's admin "
                             "for EDIT on it (deploy/tracking-server.md, users and permissions)")


def open_run(uri: str, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
             parent_run_id: str | None = None, source: str = "nmt", adopt_run_id: str | None = None,
             user: str = "") -> Run:
    """The MLflow run for run_name, RUNNING: the existing one when resuming, else a new one (mlflow_run ends it).

    `source` is the command that made the run (e.g. "nmt train"), shown as the run's Source; `user` the
    tracking server's login, shown as its User. `adopt_run_id` is a run made for this command by someone
    else (`mlflow run` sets MLFLOW_RUN_ID): it becomes the run, instead of a new one, when it is in this store.
    """
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    try:
        experiment_id = _experiment_id(client, uri, experiment)
        run_id = _existing_run(client, experiment_id, run_name)
        logged = {}
        if run_id:
            client.update_run(run_id, status="RUNNING")
            # A resume may extend the run (a larger train.max_steps): MLflow keeps params as first logged,
            # so only those a lost response left unwritten are added.
            logged = client.get_run(run_id).data.params
        else:
            all_tags = {**standard_tags(source, user), RUN_NAME_TAG: run_name, "mlflow.runName": run_name,
                        **{key: redact_uri(str(value)) for key, value in tags.items()}}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run_id = _adopted(client, uri, adopt_run_id, all_tags) or _created(client, experiment_id, run_name,
                                                                               all_tags)
        items = sorted((key, value) for key, value in params.items() if key not in logged)
        for start in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            client.log_batch(run_id, params=[_param(k, v) for k, v in items[start: start + 100]])
    except MlflowException as err:
        refused = _refused(err, uri, f"writing run {run_name!r} in experiment {experiment!r}", user)
        if refused is not None:
            raise refused from None
        raise
    return Run(uri, run_id)


def already_exists(err: Exception) -> bool:
    """Whether MLflow refused to create something because it exists (its error codes spell that two ways)."""
    return getattr(err, "error_code", None) in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS")


def _experiment_id(client, uri: str, experiment: str) -> str:
    """The experiment's id, made if it does not exist (by this process or, at the same moment, another)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found:
        return found.experiment_id
    try:
        return client.create_experiment(experiment, artifact_location=artifact_location(uri))
    except MlflowException as err:
        if not already_exists(err):
            raise
        return client.get_experiment_by_name(experiment).experiment_id  # two sweeps started together


def _param(key: str, value: Any):
    import mlflow

    return mlflow.entities.Param(key, redact_uri(str(value))[:6000])


def _existing_run(client, experiment_id: str, run_name: str) -> str | None:
    """The run of this name already in the experiment (a resume), the oldest if a lost response made two."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
                               order_by=["attributes.start_time ASC"], max_results=1)
    return found[0].info.run_id if found else None


def _adopted(client, uri: str, adopt_run_id: str | None, tags: dict[str, str]) -> str | None:
    """The run `mlflow run` made for this command, with our tags; its maker's source tags stay."""
    from mlflow.exceptions import MlflowException

    if not adopt_run_id:
        return None
    try:
        adopted = client.get_run(adopt_run_id)
    except MlflowException:
        logger.warning(f"MLFLOW_RUN_ID {adopt_run_id} is not a run of {redact(uri)}; starting a run of its own")
        return None
    client.log_batch(adopted.info.run_id, tags=[_tag(k, v) for k, v in tags.items()
                                                 if not (k.startswith("mlflow.source.") and k in adopted.data.tags)])
    return adopted.info.run_id


def _created(client, experiment_id: str, run_name: str, tags: dict[str, str]) -> str:
    """A new run. MLflow retries a create whose response was lost, which can make a second run of the name:
    the oldest is kept and any other ended FAILED, so none stays RUNNING."""
    created = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
    twins = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
                               order_by=["attributes.start_time ASC"], max_results=10)
    kept = twins[0].info.run_id if twins else created
    for twin in twins[1:]:
        client.set_tag(twin.info.run_id, "nmt.duplicate_of", kept)
        client.set_terminated(twin.info.run_id, status="FAILED")
    return kept


@contextlib.contextmanager
def mlflow_run(uri: str, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
               parent_run_id: str | None = None, source: str = "nmt", adopt_run_id: str | None = None,
               user: str = ""):
    """The one place a run starts and ends: open_run(...) for the block, then FINISHED, KILLED (Ctrl-C) or FAILED.

    The block sets run.end_tags (and run.end_status, e.g. KILLED for a rejected trial) for a normal end.
    A SystemExit leaves the run RUNNING: that is Tune stopping a trial (ASHA); the sweep's summary marks
    its trials' early stops. The driver turns Ray Train's own Ctrl-C exit into KeyboardInterrupt first.
    """
    run = retrying(lambda: open_run(uri, experiment, run_name, params, tags, parent_run_id, source, adopt_run_id,
                                    user), f"opening MLflow run {run_name}", END_WAIT_S)
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
