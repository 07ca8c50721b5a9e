"""What training reports become in MLflow: metric entries at their steps, restart tags, every node's system
metrics, the buffered logger that rides out an outage, and the Ray Train callback that runs it."""

from __future__ import annotations

import math
from typing import Any

from ..common import log
from ..common.environment import set_for_process
from ..common.messages import INTERNAL_KEYS, STEP_KEYS, Report, Restart
from .login import redact
from .target import TrackingTarget
from .tracking import Run

logger = log.get("mlflow")


def metric_entries(report: Report) -> list:
    """The numeric values of a report, and of the earlier progress values it carries, at their steps and times."""
    import time

    import mlflow

    now = time.time()
    # NaN marks a value that does not exist (the val_bleu of a checkpoint taken on a preemption notice).
    return [mlflow.entities.Metric(_chart_name(k, row), float(v), int(row.get("time", now) * 1000),
                                   int(row.get("step", 0)))
            for row in report.rows() for k, v in row.items()
            if k not in STEP_KEYS + INTERNAL_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]


def _chart_name(key: str, row: dict[str, Any]) -> str:
    """A metric's MLflow name: the averaged checkpoint's scores get their own (val_bleu_averaged, ...), so that
    a learning curve shows the training run and does not end in another model's figure."""
    return f"{key}_averaged" if "averaged" in row and key.startswith("val_") else key


def node_metric_entries(samples: list[dict[str, float]]) -> list:
    """Node samples (system/<node>/<metric>, each with its time and step) as metric entries."""
    import mlflow

    return [mlflow.entities.Metric(k, float(v), int(sample["time"] * 1000), int(sample.get("step", 0)))
            for sample in samples for k, v in sample.items()
            if k not in STEP_KEYS and isinstance(v, (int, float)) and math.isfinite(v)]


def restart_tags(report: Report) -> dict[str, str]:
    """A tag per restart that a report (or its earlier values) tells of: restart.<n> = why, where, how many workers."""
    return {key: tag for row in report.rows() for key, tag in Restart.tag(row).items()}


def log_metrics(run: Run, values: dict[str, Any]) -> None:
    """Log numeric values (e.g. an evaluation's scores) at their step."""
    run.log_entries(metric_entries(Report(values)))


def _reason(err: Exception) -> str:
    """The start of an error's message, for a log line: redacted before it is cut, which could split a URI's login."""
    return redact(str(err))[:200]


class MetricLogger:
    """Logs reports to MLflow without ever failing training: while the store is unreachable or refuses
    (a restart, HTTP 503 under load), reports wait in a bounded buffer with their original timestamps
    and go out in order once it answers again, tried again after a backoff that doubles up to BACKOFF_MAX_S."""

    MAX_PENDING = 100_000  # metric entries; beyond it the oldest are dropped, and the gap is reported
    BATCH = 1000  # MLflow's limit of metrics per log_batch call
    FINAL_WAIT_S = 120.0  # after the last report no later one will retry: wait this long for the store
    BACKOFF_MAX_S = 60.0  # the longest wait between two tries while the store fails

    def __init__(self, run: Run):
        self.run = run
        self.pending: list = []
        self.pending_tags: list = []
        self.queued, self.sent, self.dropped = 0, 0, 0  # metric values, over the run: what tracking_load counts
        self.failing_since: float | None = None
        self.backoff_s, self.next_try = 0.0, 0.0  # no waiting until a send fails

    def log(self, report: Report, extra: list | None = None, tags: dict[str, str] | None = None) -> None:
        """Queue one report's metrics and send everything queued, unless the backoff says to wait; keep what fails.

        The last report of a run (Report.final) keeps trying, backing off, for up to FINAL_WAIT_S: training
        is over, and nothing after it would deliver what is still queued.
        """
        import time

        import mlflow

        entries = [*metric_entries(report), *(extra or [])]
        self.pending.extend(entries)
        self.queued += len(entries)
        self.pending_tags.extend(mlflow.entities.RunTag(k, v) for k, v in (tags or {}).items())
        if len(self.pending) > self.MAX_PENDING:
            self.dropped += len(self.pending) - self.MAX_PENDING
            del self.pending[: len(self.pending) - self.MAX_PENDING]
        final = report.final
        if not final and time.monotonic() < self.next_try:
            return
        deadline = time.monotonic() + (self.FINAL_WAIT_S if final else 0.0)
        while not self._send():
            wait = min(self.next_try - time.monotonic(), deadline - time.monotonic())
            if wait <= 0:
                break
            time.sleep(wait)
        if self.pending and final:
            logger.warning(f"{redact(self.run.uri)} did not answer within {self.FINAL_WAIT_S:.0f}s after training: "
                           f"{len(self.pending)} metric values were not logged")

    def _send(self) -> bool:
        """Send everything queued, oldest first; False (a warning when an outage starts, the backoff doubled) if
        the store fails. What a failed call carried stays first in the queue."""
        import random
        import time

        sent = 0
        try:
            client = self.run.client()
            if self.pending_tags:
                client.log_batch(self.run.id, tags=self.pending_tags)
                self.pending_tags = []
            while self.pending:
                client.log_batch(self.run.id, metrics=self.pending[: self.BATCH])
                sent += min(self.BATCH, len(self.pending))
                self.sent += min(self.BATCH, len(self.pending))
                del self.pending[: self.BATCH]
        except Exception as err:  # any store failure: training must go on
            self.backoff_s = min(max(2 * self.backoff_s, 1.0), self.BACKOFF_MAX_S)
            self.next_try = time.monotonic() + self.backoff_s * random.uniform(0.8, 1.2)  # many trials: not in step
            if self.failing_since is None:
                self.failing_since = time.monotonic()
                logger.warning(f"cannot log metrics to {redact(self.run.uri)} ({type(err).__name__}: {_reason(err)}); "
                               "training goes on and the metrics are kept until MLflow answers again")
            return False
        self.backoff_s, self.next_try = 0.0, 0.0
        if self.failing_since is not None:
            lost = f"; {self.dropped} metric values dropped so far (buffer full)" if self.dropped else ""
            logger.warning(f"{redact(self.run.uri)} answers again after {time.monotonic() - self.failing_since:.0f}s: "
                           f"logged {sent} delayed metric values{lost}")
            self.failing_since = None
        return True


def log_best(run: Run, val_bleu: float, step: int) -> None:
    """best_val_bleu and best_step: the run's best validation, the figure its tables and plots should show."""
    log_values(run, {"best_val_bleu": val_bleu, "best_step": float(step)}, step)


def log_values(run: Run, values: dict[str, float], step: int) -> None:
    """Metrics of the run at one step, logged now."""
    run.log_entries([_metric(key, value, step) for key, value in values.items()])


def _metric(key: str, value: float, step: int):
    import time

    import mlflow

    return mlflow.entities.Metric(key, float(value), int(time.time() * 1000), int(step))


# In Ray Train's controller, which only logs metrics: MetricLogger retries with its own backoff, so each
# call fails in seconds rather than after MLflow's minutes of retries, which would stall the controller.
CONTROLLER_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def report_callback(run: Run, target: TrackingTarget, system_metrics_s: float = 0.0):
    """A Ray Train callback, run on the controller, that logs rank 0's reports to MLflow (one place).

    Every rank's report brings its node's samples; with system_metrics_s > 0 the controller also samples
    its own node (the driver's figures, under MLflow's system/ names), from the first report to the last.
    The target (with its login) travels inside the callback, not in an environment variable Ray shows.
    """
    from ray.train import UserCallback

    from ..common.node_metrics import NodeSampler

    class MLflowReportCallback(UserCallback):
        def __init__(self):
            self.logger = MetricLogger(run)
            self.sampler: NodeSampler | None = None
            self.step, self.started = 0, False

        def _start(self) -> None:
            log.setup()  # this runs in Ray Train's controller process: its warnings need a handler there
            target.activate()
            set_for_process(CONTROLLER_HTTP)
            if system_metrics_s > 0:
                self.sampler = NodeSampler("", system_metrics_s, lambda: self.step)

        def after_report(self, run_context, metrics, checkpoint):
            if not self.started:  # the first report, in the controller (the callback is built in the driver)
                self._start()
                self.started = True
            if metrics:  # rank 0's report for the run's metrics; every rank's for its node's system metrics
                ranks = [Report.from_metrics(m) for m in metrics]
                report = ranks[0]
                self.step = int(report.values.get("step", self.step))
                samples = [*(s for rank in ranks for s in rank.node_samples), *(self.sampler.drain() if self.sampler
                                                                               else ())]
                if report.final and self.sampler is not None:
                    self.sampler.stop.set()
                self.logger.log(report, extra=node_metric_entries(samples), tags=restart_tags(report))

    return MLflowReportCallback()
