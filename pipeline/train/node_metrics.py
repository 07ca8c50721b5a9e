"""System metrics of every node that hosts a training worker, sampled there and logged by the driver's callback.

MLflow's own monitor runs in one process and describes one node. Here the first worker on each node
samples that node with MLflow's collectors (CPU, memory, disk, network, and GPU utilisation and
memory where there is one) and the samples travel with the worker's reports, so a straggler or an
idle GPU on any node shows in the run as `system/<node>/<metric>`. Workers never talk to MLflow.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

MAX_SAMPLES = 10_000  # kept while reports are not going out; beyond it the oldest are dropped


def _collectors() -> list:
    """MLflow's system-metric collectors for this machine (a GPU one only where a GPU answers)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    collectors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    with contextlib.suppress(Exception):  # no NVIDIA driver or pynvml: no GPU figures, as in MLflow's monitor
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)
        collectors.append(GPUMonitor())
    return collectors


class NodeSampler:
    """Samples this node every interval_s in a daemon thread; drain() hands over what was sampled since."""

    def __init__(self, node: str, interval_s: float, step=lambda: 0):
        self.prefix, self.interval_s, self.step = f"system/{node}/", interval_s, step
        self.samples: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.collectors = _collectors()
        self.thread = threading.Thread(target=self._run, name="NodeSampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            sample = {"time": time.time(), "step": self.step()}
            for collector in self.collectors:
                with contextlib.suppress(Exception):  # a collector that fails once must not end the sampling
                    collector.collect_metrics()
                    sample.update({self.prefix + k: v for k, v in collector.aggregate_metrics().items()})
                    collector.clear_metrics()
            with self.lock:
                self.samples = [*self.samples[-(MAX_SAMPLES - 1):], sample]

    def drain(self) -> list[dict]:
        """The samples taken since the last drain."""
        with self.lock:
            taken, self.samples = self.samples, []
        return taken

    def close(self) -> None:
        """Stop sampling."""
        self.stop.set()
