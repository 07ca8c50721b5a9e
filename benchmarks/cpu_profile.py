"""Where a command's CPU time goes: every process on the machine sampled from /proc, by kind of process.

    python benchmarks/cpu_profile.py [--interval 1] [--json OUT] -- make test

Each sample adds a process's new CPU time to what it is at that moment: a Ray worker counts as
`ray::IDLE` while it starts and imports, then as its actor (`ray::TrainController`, ...). Processes that
live shorter than the interval are missed. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
# Where the command line names one of these, it names the kind (the first match wins).
NAMED = ("gcs_server", "raylet", "dashboard/dashboard.py", "log_monitor", "autoscaler/_private/monitor", "postgres",
         "huey_consumer", "uvicorn", "mlflow", "chromium", "chromedriver", "moto")


def machine_cpu() -> float:
    """CPU-seconds the whole machine spent busy since boot (all but idle and iowait)."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def kind(argv: list[str], comm: str) -> str:
    """A short name for what a process is: Ray's title, a known server, a Python script or module, else its name."""
    if not argv:
        return comm
    if argv[0].startswith("ray::"):
        return argv[0].split(".")[0]
    line = " ".join(argv)
    for name in NAMED:
        if name in line:
            return name.rsplit("/", 1)[-1]
    if "python" in os.path.basename(argv[0]):
        for i, arg in enumerate(argv[1:], 1):
            if arg == "-c":
                return "python -c"
            if arg == "-m":
                return " ".join(["python -m", *argv[i + 1:i + 2]])
            if not arg.startswith("-"):
                return os.path.basename(arg)
    return os.path.basename(argv[0])


def sample(seen: dict, totals: collections.Counter, bucket: collections.Counter, first: bool) -> None:
    """Add every process's CPU time since the last sample to its kind (at the first sample, only remember it)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        key = (pid, fields[19])  # the start time tells a reused pid apart
        name = kind([a for a in argv if a], stat[stat.index("(") + 1: stat.rindex(")")])
        before = seen.get(key, cpu if first else 0.0)
        seen[key] = cpu
        if cpu > before:
            totals[name] += cpu - before
            bucket[name] += cpu - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--json", help="write the totals and a timeline of 30 s buckets here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run after --")
    seen, totals, timeline = {}, collections.Counter(), collections.defaultdict(collections.Counter)
    start, busy = time.monotonic(), machine_cpu()
    sample(seen, totals, timeline[0], first=True)
    process = subprocess.Popen(command)
    while process.poll() is None:
        time.sleep(args.interval)
        sample(seen, totals, timeline[int((time.monotonic() - start) // 30)], first=False)
    wall, busy = time.monotonic() - start, machine_cpu() - busy
    cores = os.cpu_count() or 1
    print(f"{wall:.0f} s, the machine busy {busy:.0f} CPU-seconds ({busy / wall / cores:.0%} of {cores} cores), "
          f"{sum(totals.values()):.0f} of them seen in processes:", file=sys.stderr)
    for name, seconds in totals.most_common(30):
        print(f"{seconds:8.1f}  {name}", file=sys.stderr)
    if args.json:
        with open(args.json + ".partial", "w") as out:
            json.dump({"wall_s": wall, "busy_s": busy, "by_kind": totals,
                       "timeline_30s": {str(b): dict(c) for b, c in sorted(timeline.items())}}, out, indent=1)
        os.replace(args.json + ".partial", args.json)
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
