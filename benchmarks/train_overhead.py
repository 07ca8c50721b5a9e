"""Tokens/s of the training loop in a bare process versus under Ray Train with 1 and 2 workers.

Prints one JSON object. Prepares a small demo corpus once (Ray Data, untimed), then runs
pipeline.train.loop.train_loop for --steps updates on it four times:

- bare_default_threads: a plain process (TorchrunContext, world size 1), torch's default threads;
- bare: the same with torch.set_num_threads(1), as Ray gives a 1-CPU worker OMP_NUM_THREADS=1;
- ray_1_worker / ray_2_workers: build_trainer (Ray Train TorchTrainer), 1 CPU per worker.

Throughput is the loop's own `tokens_per_s` (target tokens per second of its log window,
`train.log_every` updates, all ranks together since update() all-reduces the token count);
the first window (warm-up) is dropped and the median of the rest reported. Bare reports come
from a subclassed context, Ray's from a UserCallback that appends rank 0's metrics to a file
(it runs on the Train controller, another process).

    python benchmarks/train_overhead.py              # 60 updates per run
    python benchmarks/train_overhead.py --steps 120
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from ray.train import UserCallback

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from pipeline.config import load_config  # noqa: E402
from pipeline.data.prepare import prepare  # noqa: E402
from pipeline.train.loop import train_loop  # noqa: E402
from pipeline.train.run import build_trainer  # noqa: E402
from pipeline.train.workers import TorchrunContext  # noqa: E402

TARGET_RAY_OVER_BARE = 0.95
THREADS = 1  # what Ray gives a worker with cpus_per_worker=1; the bare process is pinned to it too
LOG_EVERY = 10


def cpu_jiffies() -> list[int]:
    """[busy, total] jiffies of all CPUs so far, whoever ran (Linux; zeros elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return [0, 0]
    return [sum(fields) - fields[3] - fields[4], sum(fields)]  # idle and iowait are not busy


class CapturingContext(TorchrunContext):
    """TorchrunContext that also keeps every report's metrics and when it arrived."""

    def __init__(self, checkpoint_root: str):
        super().__init__(checkpoint_root)
        self.reports: list[dict] = []

    def report(self, metrics: dict, checkpoint_dir: str | None = None) -> None:
        """Record, then report as torchrun would."""
        self.reports.append({**metrics, "t": time.perf_counter(), "cpu": cpu_jiffies()})
        super().report(metrics, checkpoint_dir)


class ReportLog(UserCallback):
    """Appends rank 0's metrics of every Ray Train report to a JSON-lines file."""

    def __init__(self, path: str):
        self.path = path

    def after_report(self, run_context, metrics, checkpoint):
        """Runs on the controller (same machine here), so the driver sees the metrics through a file."""
        if metrics:
            with open(self.path, "a") as f:
                f.write(json.dumps({**metrics[0], "t": time.time(), "cpu": cpu_jiffies()}) + "\n")


def bench_config(steps: int, num_workers: int, data_dir: str):
    """configs/demo.yaml on a 6k-pair corpus, `steps` updates, validation only at the end."""
    return load_config(REPO_ROOT / "configs" / "demo.yaml", [
        f"data.output_dir={data_dir}", "data.demo_sizes={train: 6000, validation: 50, test: 50}",
        f"train.max_steps={steps}", "train.epochs=1000",  # steps, not epochs, end the run
        "train.val_interval=1000000000", "train.average_last=1", f"train.log_every={LOG_EVERY}",
        f"train.num_workers={num_workers}", "train.cpus_per_worker=1", "train.keep_checkpoints=1",
    ])


def summary(reports: list[dict], wall_s: float, num_workers: int) -> dict:
    """Median tokens/s over the log windows after the first, plus what the run did."""
    if len(reports) < 3:
        raise SystemExit(f"only {len(reports)} reports; raise --steps to at least {3 * LOG_EVERY}")
    rates = [r["tokens_per_s"] for r in reports[1:]]
    median = statistics.median(rates)
    # Cores the whole machine kept busy over the measured windows: the loop's own 1 (or 2)
    # plus whatever Ray's controller, actors and daemons took from the other core.
    busy, total = (b - a for a, b in zip(reports[0]["cpu"], reports[-1]["cpu"]))
    return {"workers": num_workers, "tokens_per_s": round(median),
            "tokens_per_s_per_worker": round(median / num_workers),
            "tokens_per_s_mean": round(statistics.fmean(rates)),
            "windows_tokens_per_s": [round(r) for r in rates], "reports": len(reports),
            "steps": reports[-1]["step"], "final_train_loss": round(reports[-1]["train_loss"], 6),
            "wall_s": round(wall_s, 2),
            "machine_busy_cores": round((os.cpu_count() or 1) * busy / total, 2) if total else None}


def run_bare(cfg, data_path: str, threads: int) -> dict:
    """The loop in this process (no process group) with `threads` torch threads."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as ckpt:
        ctx = CapturingContext(ckpt)
        start = time.perf_counter()
        train_loop({"config": cfg.to_dict(), "data_path": data_path}, ctx)
        wall = time.perf_counter() - start
    result = summary(ctx.reports, wall, 1)
    # A window starts just before the previous report, so report-to-report time is its length.
    measured = ctx.reports[1:]
    dts = [b["t"] - a["t"] for a, b in zip(ctx.reports, measured)]
    tokens = sum(r["tokens_per_s"] * dt for r, dt in zip(measured, dts))
    steps = measured[-1]["step"] - ctx.reports[0]["step"]
    result.update(threads=threads, target_tokens_per_step=round(tokens / steps),
                  tokens_per_s_time_weighted=round(tokens / sum(dts)))
    return result


def run_ray(cfg, manifest, storage: str) -> dict:
    """The loop under Ray Train (TorchTrainer from build_trainer); wall_s is fit() alone."""
    workers = cfg.train.num_workers
    log = Path(storage) / f"reports-{workers}.jsonl"
    trainer = build_trainer(cfg, manifest, f"bench-{workers}w", storage, callbacks=[ReportLog(str(log))])
    start = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - start
    reports = [json.loads(line) for line in log.read_text().splitlines()]
    return {**summary(reports, wall, workers), "threads": THREADS}


def machine() -> dict:
    """CPU model, core count, OS and library versions."""
    import ray

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")),
                 platform.processor())
    return {"cpu": model, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer updates per run (default 60)")
    args = parser.parse_args(argv)
    if args.steps < 3 * LOG_EVERY:
        parser.error(f"--steps must be at least {3 * LOG_EVERY}: the first of its {LOG_EVERY}-step windows is warm-up")

    import ray

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        # Nothing here logs to MLflow; a temp store keeps any accidental use out of the working dir.
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level=logging.WARNING)
        ray.data.DataContext.get_current().enable_progress_bars = False
        load_before = os.getloadavg()[0]  # other work on the machine skews every figure
        default_threads = torch.get_num_threads()
        cfg = bench_config(args.steps, 1, f"{tmp}/data")
        manifest = prepare(cfg.data)
        max_tokens, model = cfg.train.max_tokens, {k: v for k, v in cfg.to_dict()["model"].items() if v is not None}

        @ray.remote(num_cpus=1)
        def worker_threads():
            return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads()}

        ray_worker_threads = ray.get(worker_threads.remote())
        runs = {"bare_default_threads": run_bare(cfg, manifest.path, default_threads),
                "bare": run_bare(cfg, manifest.path, THREADS)}
        torch.set_num_threads(default_threads)
        for workers, name in ((1, "ray_1_worker"), (2, "ray_2_workers")):
            runs[name] = run_ray(bench_config(args.steps, workers, f"{tmp}/data"), manifest, f"{tmp}/runs")
        load_after = os.getloadavg()[0]
        info = machine()
        ray.shutdown()

    bare, ray1, ray2 = runs["bare"]["tokens_per_s"], runs["ray_1_worker"]["tokens_per_s"], \
        runs["ray_2_workers"]["tokens_per_s"]
    ray_over_bare = round(ray1 / bare, 3)
    print(json.dumps({
        "benchmark": "train_overhead",
        "what": ("median over log windows (first dropped) of the loop's tokens_per_s: target (non-pad) "
                 "tokens per second, all workers together (rank 0's figure, after update()'s all-reduce)"),
        "machine": info, "loadavg_1m": {"start": round(load_before, 2), "end": round(load_after, 2)},
        "data": {"train_pairs": manifest.splits["train"].pairs, "max_tokens_per_worker": max_tokens,
                 "model": model},
        "steps": args.steps, "log_every": LOG_EVERY, "threads": THREADS,
        "bare_default_threads_count": default_threads, "ray_worker_threads": ray_worker_threads,
        "same_loss_bare_vs_ray_1_worker": runs["bare"]["final_train_loss"] == runs["ray_1_worker"]["final_train_loss"],
        **runs,
        "ratios": {
            "ray_1_worker_over_bare": ray_over_bare,
            "ray_2_workers_over_ray_1_worker": round(ray2 / ray1, 3),
            "bare_default_threads_over_bare": round(runs["bare_default_threads"]["tokens_per_s"] / bare, 3),
        },
        "targets": {"ray_1_worker_over_bare_min": TARGET_RAY_OVER_BARE,
                    "ray_1_worker_over_bare_met": ray_over_bare >= TARGET_RAY_OVER_BARE},
    }))


if __name__ == "__main__":
    main()
