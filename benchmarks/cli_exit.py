"""How long `nmt train` takes to end once its work is done: `nmt`'s exit against the interpreter's usual one.

Prints one JSON object. Starts a local Ray (2 CPUs), then runs the same short `nmt train` (the small demo
config, 40 updates, its own SQLite MLflow store) --repeats times each way, alternating:

- nmt: `python -m pipeline train ...`, the command as users run it (pipeline.cli.run);
- usual_exit: `python -c "sys.exit(pipeline.cli.main())" train ...`, the same work followed by CPython's full
  teardown of every module.

For each command it records the wall time and the tail: the seconds from its last output line (the run's
summary) to the process's end.

    python benchmarks/cli_exit.py               # 3 commands each way
    python benchmarks/cli_exit.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from small import SMALL as SMALL_CONFIG  # noqa: E402  (the tests' small demo config)

SMALL = [*SMALL_CONFIG, "train.max_steps=40", "train.val_interval=20", "train.epochs=100"]
ENTRIES = {"nmt": ["-m", "pipeline"],
           "usual_exit": ["-c", "import sys; from pipeline.cli import main; sys.exit(main())"]}


def timed(argv: list[str]) -> dict:
    """Run argv; its wall time and the seconds between its last output line and its end."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last_line_at, lines = started, []
    for line in process.stdout:
        last_line_at = time.perf_counter()
        lines.append(line)
    process.wait()
    ended = time.perf_counter()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {process.returncode}:\n{''.join(lines[-20:])}")
    return {"wall_s": round(ended - started, 2), "tail_s": round(ended - last_line_at, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=True, logging_level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="nmt-cli-exit-"))
    data = [f"data.output_dir={work / 'data'}"]
    common = ["--config", "configs/demo.yaml", "--address", ray.get_runtime_context().gcs_address]
    subprocess.run([sys.executable, "-m", "pipeline", "prepare", *common,
                    *(x for item in [*SMALL, *data] if item.startswith("data.") for x in ("--set", item))],
                   cwd=REPO_ROOT, check=True, capture_output=True)  # untimed: every command reuses it
    runs: dict[str, list[dict]] = {name: [] for name in ENTRIES}
    for repeat in range(args.repeats):
        for name, entry in ENTRIES.items():
            sets = [*SMALL, *data, f"train.storage_path={work / name / str(repeat)}", f"train.run_name={name}",
                    f"tracking.tracking_uri=sqlite:///{work / name / f'mlflow{repeat}.db'}"]
            runs[name].append(timed([sys.executable, *entry, "train", *common,
                                     *(x for item in sets for x in ("--set", item))]))
    ray.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    medians = {name: {key: statistics.median(r[key] for r in results) for key in ("wall_s", "tail_s")}
               for name, results in runs.items()}
    print(json.dumps({
        "benchmark": "cli_exit",
        "ran_on": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": "nmt train, small demo config, 40 updates, 1 worker, local Ray",
        "repeats": args.repeats, "runs": runs, "median": medians,
        "tail_saved_s": round(medians["usual_exit"]["tail_s"] - medians["nmt"]["tail_s"], 2),
        "wall_ratio_nmt_over_usual": round(medians["nmt"]["wall_s"] / medians["usual_exit"]["wall_s"], 3),
    }))


if __name__ == "__main__":
    main()
