"""Whether the cluster can place a run's training workers, asking an autoscaler for nodes while it cannot."""

from __future__ import annotations

import time

from ..common import log
from ..common.errors import UserError
from ..config import TrainConfig

logger = log.get("train")
PROGRESS_EVERY_S = 60.0  # a line while the workers wait for nodes: an autoscaler's GPU node takes minutes


def check_capacity(train: TrainConfig, wait_s: float) -> None:
    """Fail within wait_s, naming what is missing, when the cluster cannot place the workers.

    An autoscaling cluster (KubeRay, the cluster launcher) adds nodes only for work it is asked
    for: while the workers do not fit, the autoscaler is asked for their bundles. wait_s 0: decide now
    (a local instance, which nothing joins).
    """
    import ray
    from ray.autoscaler.sdk import request_resources

    workers = train.fewest_workers()  # an elastic run starts with what fits, from min_workers up
    need_cpu, need_gpu = workers * train.cpus_per_worker, workers * int(train.use_gpu)
    bundle = train.worker_bundle()
    count_key = "min_workers" if train.elastic else "num_workers"
    deadline = time.monotonic() + wait_s
    requested = False
    try:
        while True:
            nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
            total_cpu = sum(n.get("CPU", 0) for n in nodes)
            total_gpu = sum(n.get("GPU", 0) for n in nodes)
            largest_cpu = max((n.get("CPU", 0) for n in nodes), default=0)
            if total_cpu >= need_cpu and total_gpu >= need_gpu and largest_cpu >= train.cpus_per_worker:
                return
            if time.monotonic() >= deadline:  # an autoscaler had its chance to add nodes
                raise UserError(
                    f"the cluster cannot fit {workers} training workers x {train.cpus_per_worker} CPU"
                    f"{' + 1 GPU' if train.use_gpu else ''}: it has {total_cpu:g} CPUs, {total_gpu:g} GPUs, at most "
                    f"{largest_cpu:g} CPUs on one node; lower train.{count_key} / train.cpus_per_worker or add nodes"
                )
            if not requested:  # a cluster without an autoscaler ignores the request
                request_resources(bundles=[bundle] * train.num_workers)  # the most: an elastic run grows into it
                requested, said = True, time.monotonic()
                logger.info(f"waiting for the cluster to fit {workers} training workers (asked its autoscaler for "
                            f"nodes; at most {wait_s / 60:.0f} min, train.resource_wait_s)")
            elif time.monotonic() - said >= PROGRESS_EVERY_S:
                said = time.monotonic()
                logger.info(f"still waiting for nodes: the cluster has {total_cpu:g} CPUs and {total_gpu:g} GPUs, the "
                            f"workers need {need_cpu:g} and {need_gpu:g}; "
                            f"{max(0.0, deadline - said) / 60:.0f} min left")
            time.sleep(1.0)
    finally:
        if requested:  # the request persists until replaced: from here the run's placement group holds the nodes
            request_resources(bundles=[])
