"""docs/test-run.txt: what one `make test` printed about itself, cut from its log, for the docs' figures.

    CI=true bash .ci/run > ci.log 2>&1; python tools/capture_test_run.py ci.log --commit "$(git rev-parse --short HEAD)"

Keeps pytest's summary line and its list of slowest tests; tests/test_readme.py checks that the
suite's size and duration stated in README.md and docs/testing.md agree with it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "test-run.txt"
SUMMARY = re.compile(r"^=+ (\d+ passed.*) in ([0-9.]+)s \(([0-9:]+)\) =+$")


def capture(log: str, commit: str) -> str:
    """The capture's text: a header, the summary line, the slowest durations."""
    lines = log.splitlines()
    summary = next((line for line in lines if SUMMARY.match(line)), None)
    if summary is None:
        raise SystemExit("no pytest summary line with a duration in the log: did the run finish?")
    start = next((i for i, line in enumerate(lines) if re.match(r"^=+ slowest \d+ durations =+$", line)), None)
    slowest = []
    if start is not None:
        slowest.append(lines[start])
        for line in lines[start + 1:]:
            if not re.match(r"^[0-9.]+s (call|setup|teardown) ", line):
                break
            slowest.append(line)
    header = [f"# make test on a clean clone of {commit}, {datetime.date.today().isoformat()}, "
              f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"]
    return "\n".join([*header, summary, *slowest]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the output of `CI=true bash .ci/run` (or `make test`)")
    parser.add_argument("--commit", required=True, help="the commit the run tested")
    args = parser.parse_args()
    text = capture(Path(args.log).read_text(errors="replace"), args.commit)
    partial = OUT.with_suffix(".tmp")
    partial.write_text(text)
    partial.replace(OUT)
    print(text, end="")


if __name__ == "__main__":
    main()
