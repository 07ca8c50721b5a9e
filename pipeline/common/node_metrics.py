"""System metrics of a node (CPU, memory, disk, network; GPU utilisation and memory where NVML answers),
sampled in a thread under MLflow's metric names.

The first training worker on each node samples it, and the samples travel with the worker's reports,
so a straggler or an idle GPU on any node shows in the run as `system/<node>/<metric>`; Ray Train's
controller samples its own node as `system/<metric>`. Both reach MLflow through the buffered metric
logger, so an outage of the server loses none of them. Workers never talk to MLflow, and do not
import it: that alone takes seconds of every worker's start.
"""

from __future__ import annotations

import contextlib
import threading
import time

import psutil

MAX_SAMPLES = 10_000  # kept while reports are not going out; beyond it the oldest are dropped


def _gpus() -> list:
    """NVML handles of this node's GPUs ([] without an NVIDIA driver or the nvidia-ml-py package)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver, no library: no GPU figures, as in MLflow's monitor
        return []


def sample(gpus: list) -> dict[str, float]:
    """One reading of this node, named as MLflow's system metrics are."""
    memory, disk, network = psutil.virtual_memory(), psutil.disk_usage("/"), psutil.net_io_counters()
    found = {"cpu_utilization_percentage": psutil.cpu_percent(),
             "system_memory_usage_megabytes": memory.used / 1e6, "system_memory_usage_percentage": memory.percent,
             "disk_usage_percentage": disk.percent, "disk_usage_megabytes": disk.used / 1e6,
             "network_receive_megabytes": network.bytes_recv / 1e6,
             "network_transmit_megabytes": network.bytes_sent / 1e6}
    for i, handle in enumerate(gpus):
        with contextlib.suppress(Exception):  # a GPU that does not answer once must not end the sampling
            import pynvml

            used = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found[f"gpu_{i}_memory_usage_megabytes"] = used.used / 1e6
            found[f"gpu_{i}_memory_usage_percentage"] = 100 * used.used / used.total
            found[f"gpu_{i}_utilization_percentage"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    return found


class NodeSampler:
    """Samples this node every interval_s in a daemon thread; drain() hands over what was sampled since.

    node names it in the metrics (system/<node>/...); "" gives MLflow's own names (system/...).
    """

    def __init__(self, node: str, interval_s: float, step=lambda: 0):
        self.prefix, self.interval_s, self.step = f"system/{node}/" if node else "system/", interval_s, step
        self.samples: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()  # never set: the daemon thread ends with the worker process
        self.thread = threading.Thread(target=self._run, name="NodeSampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        gpus = _gpus()
        psutil.cpu_percent()  # the first reading only starts the count
        while not self.stop.wait(self.interval_s):
            reading = {"time": time.time(), "step": self.step()}
            with contextlib.suppress(Exception):
                reading.update({self.prefix + k: v for k, v in sample(gpus).items()})
            with self.lock:
                self.samples = [*self.samples[-(MAX_SAMPLES - 1):], reading]

    def drain(self) -> list[dict]:
        """The samples taken since the last drain."""
        with self.lock:
            taken, self.samples = self.samples, []
        return taken
