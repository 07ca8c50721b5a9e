"""What crosses a process boundary between the driver, Ray Train's controller and the training workers.

Each is a frozen dataclass that both sides import; Ray carries a plain dict (train_loop_config, the
metrics of ray.train.report), made by to_dict / to_metrics on one side and read back by from_dict /
from_metrics on the other, so a key is spelled in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# How a Report travels as Ray Train metrics: its own values at the top level (what Tune and the
# checkpoint ranking read), the rest under these keys.
EARLIER_KEY = "progress_values"  # progress values held back since the last report, each with its step and time
FINAL_KEY = "final"  # True on a run's last report: whatever is still held must reach MLflow now
NODE_KEY = "node_metrics"  # the samples of the reporting rank's node, [{time, step, system/<node>/<metric>: value}]
STEP_KEYS = ("step", "time")  # where a report's values belong, not values themselves
# Values for the loop's own checks (replicas in sync, checkpoints averaged): not metrics to chart.
INTERNAL_KEYS = ("param_checksum", "averaged")


@dataclass(frozen=True)
class Report:
    """One rank's report: its values (step, time, train_loss, val_bleu, ...), the progress values held back
    since its last report, whether it is the run's last, and its node's system-metric samples."""

    values: dict[str, Any]
    earlier: tuple[dict[str, Any], ...] = ()
    final: bool = False
    node_samples: tuple[dict[str, float], ...] = ()

    def rows(self) -> list[dict[str, Any]]:
        """The held progress values, then the report's own: every row of values, each with its step and time."""
        return [*self.earlier, self.values]

    def to_metrics(self) -> dict[str, Any]:
        """The dict ray.train.report carries."""
        return {**self.values, EARLIER_KEY: list(self.earlier), FINAL_KEY: self.final,
                NODE_KEY: list(self.node_samples)}

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any]) -> Report:
        """A report back from what Ray Train handed a callback."""
        values = {k: v for k, v in metrics.items() if k not in (EARLIER_KEY, FINAL_KEY, NODE_KEY)}
        return cls(values, tuple(metrics.get(EARLIER_KEY) or ()), bool(metrics.get(FINAL_KEY)),
                   tuple(metrics.get(NODE_KEY) or ()))

    def validated(self) -> bool:
        """Whether it carries a validation score (a preemption checkpoint's val_bleu is NaN: none)."""
        return math.isfinite(self.values.get("val_bleu", math.nan))


@dataclass(frozen=True)
class Restart:
    """Why a worker group resumed from a checkpoint, and from how many workers (logged once, as a tag)."""

    cause: str  # resize, preemption, failure, rerun (elastic.restart_cause)
    from_workers: int
    from_step: int
    number: int  # the run's restarts so far, this one included

    def values(self) -> dict[str, Any]:
        """As report values, sent once with the first report after the restart."""
        return {"restarts": self.number, "restart_cause": self.cause, "resumed_from_step": self.from_step,
                "restart_from_workers": self.from_workers}

    @staticmethod
    def tag(values: dict[str, Any]) -> dict[str, str]:
        """The MLflow tag of a row of report values that tells of a restart (none for other rows)."""
        if "restart_cause" not in values:
            return {}
        return {f"restart.{values['restarts']}": f"{values['restart_cause']} at step {values['resumed_from_step']}, "
                                                 f"{values['restart_from_workers']} -> {values['world_size']} workers"}


@dataclass(frozen=True)
class ParentInit:
    """The model a fine-tuning run starts from: where its staged weights are, and what it is."""

    path: str
    described: str


@dataclass(frozen=True)
class LoopArgs:
    """Everything a training worker starts from (Ray's train_loop_config, which the Train state API shows:
    the config holds no login, tracking.redacted has taken it out)."""

    config: dict[str, Any]  # the config tree as a plain dict; the worker rebuilds the Config from it
    data_path: str  # the prepared dataset (its manifest's directory)
    log_level: int
    attempt: str  # this fit's id: a checkpoint tells whether a resume is a new command's (a rerun)
    init: ParentInit | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plain dict Ray carries."""
        return {"config": self.config, "data_path": self.data_path, "log_level": self.log_level,
                "attempt": self.attempt, "init": vars(self.init) if self.init else None}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LoopArgs:
        """The arguments back on the worker."""
        init = values.get("init")
        return cls(values["config"], values["data_path"], int(values.get("log_level", 20)),
                   values.get("attempt", ""), ParentInit(**init) if init else None)
