"""Reading the console output of an `nmt` command that ran on a local Ray."""

import re

# Ray prefixes each line that a worker process prints, e.g. "\x1b[36m(run_trial pid=123)\x1b[0m ".
WORKER_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)\n]*pid=\d+[^)\n]*\)")


def driver_output(log: str) -> str:
    """The lines the driver printed itself, without those Ray forwards from its worker processes.

    A worker that Ray ends with SIGTERM may print a traceback from Ray's own signal handler
    (seen once: raised inside a weakref callback of a finished trial's worker); that is not
    the command's output, and a check for tracebacks there would be flaky.
    """
    return "\n".join(line for line in log.splitlines() if not WORKER_LINE.match(line))


def leaks(secrets: list[str], texts: dict[str, str], files: list) -> dict[str, list[str]]:
    """Where any secret appears: {place: its first lines that hold one}, over texts and every file under files."""
    from pathlib import Path

    texts = dict(texts)
    for root in files:
        for path in Path(root).rglob("*"):
            if path.is_file():
                texts[str(path)] = path.read_bytes().decode("utf-8", "replace")
    return {where: [line[:300] for line in text.splitlines() if any(s in line for s in secrets)][:3]
            for where, text in texts.items() if any(s in text for s in secrets)}
