"""A replica's reports to Ray Train, with its node's system metrics and, once after a restart, why it restarted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..common.messages import Report, Restart
from ..common.node_metrics import NodeSampler
from .workers import WorkerContext, all_gather_objects


class Reporter:
    """Sends a rank's reports; the first worker on each node samples that node's system metrics for them."""

    def __init__(self, ctx: WorkerContext, system_metrics_s: float, step: Callable[[], int],
                 restart: Restart | None = None):
        self.ctx, self.restart = ctx, restart
        self.node_sampler: NodeSampler | None = None
        # By node id, not Ray Train's local rank: that groups workers by IP, which nodes may share.
        first_on_node = all_gather_objects(ctx.node).index(ctx.node) == ctx.world_rank
        if first_on_node and system_metrics_s > 0:
            self.node_sampler = NodeSampler(ctx.node, system_metrics_s, step)

    def send(self, report: Report, directory: str | None = None) -> None:
        """Report (a barrier on every rank), with a checkpoint directory when there is one."""
        if self.node_sampler is not None:
            report = dataclasses.replace(report, node_samples=tuple(self.node_sampler.drain()))
        self.ctx.report(report.to_metrics(), directory)

    def restart_values(self) -> dict:
        """Once after a resume: the step it resumed from and why (MLflow gets a tag per restart)."""
        restart, self.restart = self.restart, None
        return restart.values() if restart else {}
