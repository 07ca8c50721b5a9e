"""`make bench`: run every benchmark script, collect their JSON in results.json and a markdown table."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from benchmark_table import write_table  # noqa: E402

SCRIPTS = ["model_step.py", "peer_hf.py", "batching.py", "prepare.py", "train_overhead.py", "tune_asha.py", "serve.py",
           "scale.py", "prepare_files.py", "tracking_load.py", "cli_exit.py"]


# Pass/fail flags some scripts print against the goals they were tuned towards: not measurements.
LEFT_OUT = {"targets", "target_met"}


def _flat(result: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) for every number or string, nested dicts included; lists are left out."""
    rows: list[tuple[str, object]] = []
    for key, value in result.items():
        if key in LEFT_OUT:
            continue
        if isinstance(value, dict):
            rows += _flat(value, f"{prefix}{key}.")
        elif not isinstance(value, list):
            rows.append((f"{prefix}{key}", value))
    return rows


def _this_machine() -> str:
    """This machine in a few words (architecture, CPUs, memory), recorded with each result as `ran_on`."""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):  # not every platform says
        memory = ""
    return f"{platform.machine()}, {os.cpu_count()} CPUs{memory}, Python {platform.python_version()}"


def _ran_on(result: dict) -> str:
    """The machine a benchmark ran on, as far as its JSON records it (scripts record it in different keys)."""
    if result.get("ran_on"):
        return str(result["ran_on"])
    parts = [str(result["device"])] if result.get("device") not in (None, "", "cpu") else []
    machine = result.get("machine")
    if isinstance(machine, dict):
        machine = ", ".join(str(value) for value in machine.values())
    if machine:
        parts.append(str(machine))
    elif result.get("cpu_count") or result.get("cpus"):
        parts.append(f"{result.get('cpu_count') or result.get('cpus')} CPUs")
    return "; ".join(parts) or "not recorded in its JSON"


def _table(results: dict[str, dict]) -> str:
    """One section per benchmark, headed by where and when it ran: every measure as a key | value row."""
    lines = ["# Benchmark results", "",
             "Every figure of `benchmarks/results.json`, one section per script, written by `benchmarks/run_all.py`; "
             "`docs/benchmarks.md` says how each was measured.", ""]
    for name, result in results.items():
        lines += [f"### {name}", "", f"Run {result.get('date', 'on a date not recorded')}, on: {_ran_on(result)}", "",
                  "| measure | value |", "|---|---|"]
        lines += [f"| {key} | {value} |" for key, value in _flat(result)]
        lines.append("")
    return "\n".join(lines)


def _write(results: dict[str, dict]) -> None:
    """results.json and results.md (each via a temporary file, then renamed), and docs/benchmarks.md's table."""
    for name, text in (("results.json", json.dumps(results, indent=2) + "\n"), ("results.md", _table(results))):
        partial = HERE / f"{name}.tmp"
        partial.write_text(text)
        partial.replace(HERE / name)
    write_table()


def main() -> int:
    """Run the scripts one after another (they would disturb each other's timings in parallel).

    With script names, only those run. Each script's entry replaces its earlier one in results.json
    (dated and with the machine it ran on, so a script that failed keeps its last figures under their own).
    """
    if sys.argv[1:] == ["--table"]:  # only rewrite results.md and the docs' table from results.json
        _write(json.loads((HERE / "results.json").read_text()))
        return 0
    results = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").exists() else {}
    failed = []
    for script in sys.argv[1:] or SCRIPTS:
        print(f"[bench] {script} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            failed.append(script)
            print(proc.stderr[-2000:], file=sys.stderr)
            continue
        results[script.removesuffix(".py")] = {**json.loads(lines[-1]), "date": datetime.date.today().isoformat(),
                                               "ran_on": _this_machine()}
        print(f"[bench] {script} done in {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    _write(results)
    print(_table(results))
    if failed:
        print(f"[bench] failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
