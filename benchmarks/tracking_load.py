"""How many concurrent trials one MLflow server carries, on SQLite and on PostgreSQL, side by side; prints JSON.

Each level starts a fresh `mlflow server --app-name basic-auth` (as deploy/ runs it: logins, proxied
artifacts) on a fresh store, makes a team with deploy/mlflow_users.py (one person per process, the
promoting login, the team's model), then runs N trials at once in several processes, each trial
doing with the pipeline's own code what a Tune trial does on a cluster:

  tracking.mlflow_run            its run under the person's sweep run (params, tags), ended FINISHED
  Run.log_datasets               the prepared splits as dataset inputs
  reports.report_callback        every report_interval_s: rank 0's report with the progress values held
                                 since the last one, a validation every few reports, each rank's node
                                 samples, and the controller's own node samples (the callback samples
                                 it), through the buffered, backing-off MetricLogger
  reports.log_best               the best validation, at the end

Trials start spread over --ramp-s, as Tune starts them while worker groups come up. When a sweep's
trials end, its best trial is marked a candidate (registry.mark_candidate, as a person's login that
may not register does); then the promoting login lists the candidates, the search `nmt promote` starts with
(registry.candidate_runs; scoring and registering their models is rehearsed elsewhere: these trials log none).
Every logged point is read back.

    python benchmarks/tracking_load.py                      # 64, 256, 512 trials; SQLite and PostgreSQL
    python benchmarks/tracking_load.py --trials 16 --processes 2 --duration-s 20 --report-interval-s 2

Figures per level: errors (requests the server failed, by kind; trials that failed), lost points
(queued by the trials but not in the store when read back), p50/p99 of the trials' requests,
requests/s served, and how long listing the candidates took.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE.parent / "deploy")]
TEAM_MODEL = "transformer-nmt-load"
# Each server worker's database pool, as deploy/ sizes it (deploy/tracking-server.md): at least twice the
# worker's 40 request threads, since MLflow's log_batch holds two connections (--pool-size, --max-overflow).
POOL_SIZE, MAX_OVERFLOW = 20, 60


def timed_requests() -> list:
    """Record (url, status, seconds) of every HTTP request this process makes (MLflow's client uses requests)."""
    import requests

    record: list = []
    original = requests.Session.request

    def request(self, method, url, *args, **kwargs):
        started = time.perf_counter()
        try:
            response = original(self, method, url, *args, **kwargs)
        except Exception as err:
            record.append((url, type(err).__name__, time.perf_counter() - started))
            raise
        record.append((url, response.status_code, time.perf_counter() - started))
        return response

    requests.Session.request = request
    return record


def progress_row(step: int, now: float, rng: random.Random) -> dict:
    """One progress line's values, as the training loop reports them."""
    return {"step": step, "time": now, "train_loss": 8.0 / math.sqrt(step) + rng.random() * 0.01,
            "tokens_per_s": 50_000 + rng.random() * 1000, "train_seconds": step * 0.1, "epoch": step // 1000,
            "world_size": 1, "lr": 1e-3 / math.sqrt(step)}


def node_samples(node: str, step: int, now: float) -> list[dict]:
    """A node's system metrics as a worker samples them (common/node_metrics.py names)."""
    names = ("cpu_utilization_percentage", "system_memory_usage_megabytes", "system_memory_usage_percentage",
             "disk_usage_percentage", "disk_usage_megabytes", "network_receive_megabytes",
             "network_transmit_megabytes", "gpu_0_memory_usage_megabytes", "gpu_0_memory_usage_percentage",
             "gpu_0_utilization_percentage")
    return [{"time": now, "step": step, **{f"system/{node}/{name}": 50.0 for name in names}}]


def run_trial(spec: dict, target, parent_id: str, index: int, delay_s: float) -> dict:
    """One trial's tracking, start to end; what its metric logger queued and sent."""
    from pipeline.common.messages import Report
    from pipeline.config import config_from_dict
    from pipeline.track import reports, tracking

    time.sleep(delay_s)
    rng, started = random.Random(index), time.time()  # the trial's training starts now
    name = f"{spec['sweep']}-trial{index:04d}"
    params = config_from_dict({}).flat()
    tags = {tracking.TRIAL_TAG: f"trial{index:04d}", "nmt.kind": "trial", "nmt.sweep": spec["sweep"]}
    callback, run_id = None, ""
    try:
        with tracking.mlflow_run(target.uri, spec["experiment"], name, params, tags, parent_run_id=parent_id,
                                 source="nmt tune (trial)", user=target.username) as run:
            run_id = run.id
            run.log_datasets([{"name": f"load/{split}", "digest": "0" * 32, "source": f"s3://team/prepared/{split}",
                               "context": split, "profile": {"pairs": 1000}} for split in ("train", "validation")])
            callback = reports.report_callback(run, target, spec["system_metrics_s"])
            step, best = 0, 0.0
            for number in range(1, spec["reports"] + 1):
                time.sleep(max(0.0, started + number * spec["report_interval_s"] - time.time()))
                now = time.time()
                rows = []
                for _ in range(spec["rows_per_report"]):
                    step += spec["log_every"]
                    rows.append(progress_row(step, now - (spec["rows_per_report"] - len(rows)) * 0.5, rng))
                values = dict(rows[-1])
                if number % spec["validate_every"] == 0 or number == spec["reports"]:
                    bleu = 30 * (1 - math.exp(-number / 5)) + rng.random()
                    best = max(best, bleu)
                    values.update(val_loss=2.0 / number, val_bleu=bleu, val_chrf=bleu * 1.8)
                report = Report(values, tuple(rows[:-1]), number == spec["reports"],
                                tuple(node_samples(f"node-{index % 64:02x}", step, now)))
                callback.after_report(None, [report.to_metrics()], None)  # what Ray Train hands the callback
            reports.log_best(run, best, step)
            run.end_tags["best_val_bleu"] = f"{best:.2f}"
        error = ""
    except Exception as err:  # a trial the pipeline gave up on: counted, never hidden
        error, best = f"{type(err).__name__}: {str(err)[:300]}", 0.0
    logger = callback.logger if callback is not None else None
    return {"run_id": run_id, "queued": logger.queued if logger else 0, "sent": logger.sent if logger else 0,
            "dropped": logger.dropped if logger else 0, "best": best, "error": error}


def sweep_process(spec: dict, out: str) -> None:
    """One person's sweep: its parent run, its trials in threads, its best trial a candidate; stats to `out`."""
    from pipeline.track import registry, tracking
    from pipeline.track.login import Login
    from pipeline.track.target import TrackingTarget

    target = TrackingTarget(spec["uri"], Login(spec["person"], spec["password"]))
    target.activate()
    record, trials, errors = timed_requests(), [], []
    try:
        parent = tracking.retrying(lambda: tracking.open_run(target.uri, spec["experiment"], spec["sweep"], {},
                                                             {"nmt.kind": "sweep"}, user=target.username),
                                   "opening the sweep's run", 120)
        count = spec["trials"]
        with ThreadPoolExecutor(max_workers=count) as pool:
            trials = list(pool.map(lambda i: run_trial(spec, target, parent.id, spec["first"] + i,
                                                       spec["ramp_s"] * i / max(count, 1)), range(count)))
        finished = [t for t in trials if t["run_id"] and not t["error"]]
        if finished:
            best = max(finished, key=lambda t: t["best"])
            registry.mark_candidate(tracking.Run(target.uri, best["run_id"]), TEAM_MODEL,
                                    f"runs:/{best['run_id']}/model", None, {"val_bleu": f"{best['best']:.4f}",
                                                                            "run_id": best["run_id"]})
        parent.end()
    except Exception as err:  # the sweep's own calls failed for good: counted with the rest
        errors.append(f"{type(err).__name__}: {str(err)[:300]}")
    Path(out).write_text(json.dumps({"trials": trials, "requests": record, "errors": errors}))


def start_server(store: str, root: Path, postgres, args):
    """A fresh `mlflow server --app-name basic-auth` on a fresh store of this kind."""
    from servers import MlflowServer

    if store == "sqlite":
        backend, auth = f"sqlite:///{root / 'mlflow.db'}", f"sqlite:///{root / 'basic_auth.db'}"
    else:
        name = f"load_{root.name[-8:].lower()}"
        backend, auth = postgres.database(name), postgres.database(f"{name}_auth")
    env = {"MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": str(args.pool_size),
           "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": str(args.max_overflow), "MLFLOW_SQLALCHEMYSTORE_POOL_RECYCLE": "1800"}
    return MlflowServer(root, backend, auth=True, auth_backend=auth, workers=args.workers, env=env,
                        auth_cache_s=args.auth_cache_s)


READ_BACK_S = 300.0  # a store still working through requests the trials gave up on may never answer in time


def read_back(server_uri: str, trials: list[dict]) -> dict:
    """Every run's status and every logged point, counted per run against what its trial queued.

    Runs not read within READ_BACK_S count as not finished, their points as lost.
    """
    from mlflow.tracking import MlflowClient

    client, deadline = MlflowClient(server_uri), time.monotonic() + READ_BACK_S

    def count(trial: dict) -> tuple[int, str]:
        if time.monotonic() > deadline:
            return 0, "not read in time"
        try:
            run = client.get_run(trial["run_id"])
            points = sum(len(client.get_metric_history(trial["run_id"], key)) for key in run.data.metrics
                         if key not in ("best_val_bleu", "best_step"))  # log_best's own, not the logger's
        except Exception as err:  # a run the store cannot even show: its points count as lost
            return 0, f"unreadable ({type(err).__name__})"
        return points, run.info.status

    with ThreadPoolExecutor(max_workers=8) as pool:
        counted = list(pool.map(count, [t for t in trials if t["run_id"]]))
    stored = sum(points for points, _ in counted)
    queued = sum(t["queued"] for t in trials)
    return {"points_queued": queued, "points_stored": stored, "lost_points": max(queued - stored, 0),
            "extra_points": max(stored - queued, 0), "runs_not_finished": sum(s != "FINISHED" for _, s in counted),
            "runs_not_read": sum(s in ("not read in time",) or s.startswith("unreadable") for _, s in counted)}


def run_level(store: str, trials: int, args, postgres) -> dict:
    """One store at one load: server up, team made, trials run, candidates listed, points read back."""
    import secrets

    from mlflow_users import create_user, team_model

    from pipeline.common.environment import environment
    from pipeline.track import registry

    root = Path(tempfile.mkdtemp(prefix=f"nmt-load-{store}-"))
    persons = {f"person{p}": secrets.token_urlsafe(12) for p in range(args.processes)}
    promoter_password = secrets.token_urlsafe(12)
    with start_server(store, root, postgres, args) as server:
        with server.admin():
            for name, password in {**persons, "promoter": promoter_password}.items():
                create_user(server.uri, name, password)
            team_model(server.uri, TEAM_MODEL, "promoter")
        per_process = [trials // args.processes + (p < trials % args.processes) for p in range(args.processes)]
        specs = [{"uri": server.uri, "person": person, "password": password, "experiment": f"{person}-sweeps",
                  "sweep": f"{person}-tune", "trials": per_process[p], "first": sum(per_process[:p]),
                  "ramp_s": args.ramp_s, "reports": max(1, round(args.duration_s / args.report_interval_s)),
                  "report_interval_s": args.report_interval_s, "rows_per_report": args.rows_per_report,
                  "log_every": 10, "validate_every": 3, "system_metrics_s": args.report_interval_s}
                 for p, (person, password) in enumerate(persons.items())]
        context = multiprocessing.get_context("spawn")
        outs = [root / f"sweep{p}.json" for p in range(args.processes)]
        started = time.monotonic()
        processes = [context.Process(target=sweep_process, args=(spec, str(out))) for spec, out in zip(specs, outs)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(args.ramp_s + args.duration_s + 900)
        wall_s = time.monotonic() - started
        results = [json.loads(out.read_text()) for out in outs if out.is_file()]
        all_trials = [t for r in results for t in r["trials"]]
        # The promoting login's `nmt promote`, then the read-back, as a user's commands would retry them.
        with environment(MLFLOW_TRACKING_USERNAME="promoter", MLFLOW_TRACKING_PASSWORD=promoter_password,
                         MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_TIMEOUT="20"):
            decided_at, found, promote_error = time.monotonic(), [], ""
            try:
                found = registry.candidate_runs(server.uri, TEAM_MODEL)
            except Exception as err:
                promote_error = f"{type(err).__name__}: {str(err)[:300]}"
            promote_s = time.monotonic() - decided_at
            stored = read_back(server.uri, all_trials)
    shutil.rmtree(root, ignore_errors=True)
    requests = [(url.removeprefix(server.uri), status, seconds) for result in results
                for url, status, seconds in result["requests"] if url.startswith(server.uri)]
    latencies = sorted(seconds for _, _, seconds in requests)
    failed: dict[str, int] = {}
    for path, status, _ in requests:
        if not isinstance(status, int) or status >= 500 or status == 429:
            failed[f"{status} {path.split('?')[0]}"] = failed.get(f"{status} {path.split('?')[0]}", 0) + 1
    sweep_errors = [e for result in results for e in result.get("errors", [])]
    return {"store": store, "trials": trials, "processes_missing": args.processes - len(results),
            "trial_errors": sum(bool(t["error"]) for t in all_trials) + trials - len(all_trials),
            "first_trial_error": next((t["error"] for t in all_trials if t["error"]), ""),
            "sweep_errors": len(sweep_errors), "first_sweep_error": sweep_errors[0] if sweep_errors else "",
            "request_errors": sum(failed.values()), "request_errors_by_kind": failed,
            **stored, "requests": len(requests), "wall_s": round(wall_s, 1),
            "requests_per_s": round(len(requests) / wall_s, 1),
            "p50_s": round(_quantile(latencies, 0.5), 3), "p99_s": round(_quantile(latencies, 0.99), 3),
            "max_s": round(latencies[-1], 3) if latencies else None,
            "candidates_found": len(found),
            "promote_error": promote_error, "promote_s": round(promote_s, 1)}


def summarized(levels: list[dict]) -> dict:
    """The levels, their headline figures under one key each (e.g. postgresql_512), and SQLite's p99 over
    PostgreSQL's at each load measured on both: what the docs' tables show."""
    keys = ("trial_errors", "request_errors", "lost_points", "runs_not_finished", "p50_s", "p99_s", "requests_per_s")
    by_level = {f"{level['store']}_{level['trials']}": {key: level[key] for key in keys} for level in levels}
    ratios = {f"p99_sqlite_over_postgresql_{n}": round(by_level[f"sqlite_{n}"]["p99_s"] /
                                                        by_level[f"postgresql_{n}"]["p99_s"], 2)
              for n in sorted({level["trials"] for level in levels})
              if f"sqlite_{n}" in by_level and f"postgresql_{n}" in by_level}
    return {"levels": levels, "by_level": by_level, **ratios}


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--processes", type=int, default=8, help="client processes (one person's sweep each)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="the server's worker processes "
                                                                             "(default: one per CPU)")
    parser.add_argument("--duration-s", type=float, default=120.0, help="how long each trial trains")
    parser.add_argument("--report-interval-s", type=float, default=10.0, help="train.report_interval_s")
    parser.add_argument("--rows-per-report", type=int, default=10, help="progress lines per report")
    parser.add_argument("--ramp-s", type=float, default=30.0, help="trials start spread over this long")
    parser.add_argument("--pool-size", type=int, default=POOL_SIZE, help="each server worker's database pool")
    parser.add_argument("--max-overflow", type=int, default=MAX_OVERFLOW, help="connections beyond the pool")
    parser.add_argument("--auth-cache-s", type=int, default=60,
                        help="how long the server caches a verified login (0: the password hash checked every request)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    from servers import PostgresCluster

    from pipeline.common import log

    log.setup()
    log.configure_libraries()  # MLflow's "View run at" lines off, in the sweep processes too
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # no requests to MLflow's telemetry service among the counted
    levels = []
    with PostgresCluster(durable=True, max_connections=500) as postgres:  # fsync on, as a real server runs
        for trials in args.trials:
            for store in args.stores:
                level = run_level(store, trials, args, postgres)
                print(json.dumps(level), file=sys.stderr, flush=True)
                levels.append(level)
    result = {"benchmark": "tracking_load", "date": time.strftime("%Y-%m-%d"), "mlflow": _version("mlflow"),
              "server_workers": args.workers,
              "auth_cache_s": args.auth_cache_s, "pool_size": args.pool_size, "max_overflow": args.max_overflow,
              "client_processes": args.processes, "trial_seconds": args.duration_s,
              "report_interval_s": args.report_interval_s, "rows_per_report": args.rows_per_report,
              "ramp_s": args.ramp_s, "cpus": os.cpu_count(), **summarized(levels)}
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(text)


def _version(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the servers and PostgreSQL stop too
    threading.stack_size(512 * 1024)  # hundreds of trial threads per process
    main()
