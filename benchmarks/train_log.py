"""Training throughput per epoch from a torchrun run's log: the JSON report lines rank 0 prints.

    python benchmarks/train_log.py RUN.err

Prints one JSON object: target tokens/s of each epoch (progress windows leave validation out),
the first epoch against the median of the later ones, and the first window alone (start-up and,
with train.compile, compiling), so that a slow first epoch shows whether it is the start or the
whole epoch.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def progress_values(log_file: Path) -> list[dict]:
    """Every progress value (one per progress line) of the run, by step, each once."""
    found = {}
    for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith('{"report"'):
            report = json.loads(line)
            for value in (*report.get("progress_values", []), report):
                if "tokens_per_s" in value and "tokens_per_update" in value:
                    found[value["step"]] = value
    return [found[step] for step in sorted(found)]


def epoch_figures(values: list[dict]) -> dict:
    """Tokens/s per epoch from the progress windows: tokens = tokens_per_update x updates, seconds = tokens / rate."""
    if not values:
        return {}
    epochs: dict[int, list[float]] = {}  # epoch -> [tokens, seconds, windows]
    previous = 0
    for value in values:
        tokens = value["tokens_per_update"] * (value["step"] - previous)
        totals = epochs.setdefault(int(value["epoch"]) + 1, [0.0, 0.0, 0])
        totals[0] += tokens
        totals[1] += tokens / max(value["tokens_per_s"], 1e-9)
        totals[2] += 1
        previous = value["step"]
    rates = {epoch: tokens / max(seconds, 1e-9) for epoch, (tokens, seconds, _) in epochs.items()}
    first = values[0]
    first_tokens = first["tokens_per_update"] * first["step"]
    first_seconds = first_tokens / max(first["tokens_per_s"], 1e-9)
    all_tokens, all_seconds = (sum(totals[i] for totals in epochs.values()) for i in (0, 1))
    result = {"epoch_tokens_per_s": {str(e): round(r) for e, r in rates.items()},
              "first_window": {"updates": first["step"], "tokens_per_s": round(first["tokens_per_s"]),
                               "seconds": round(first_seconds, 1)},
              "train_tokens_per_s": round(all_tokens / max(all_seconds, 1e-9)),
              "train_seconds": round(max(v["train_seconds"] for v in values), 1)}
    later = [rate for epoch, rate in rates.items() if 1 < epoch < max(rates)]  # the last one may be cut short
    if later and 1 in rates:
        typical = statistics.median(later)
        result["later_epochs_tokens_per_s"] = round(typical)
        result["first_epoch_vs_later"] = round(rates[1] / typical, 3)
        tokens, seconds, windows = epochs[1]
        if windows > 1:  # the first epoch without its first window
            rest = (tokens - first_tokens) / max(seconds - first_seconds, 1e-9)
            result["first_epoch_after_first_window_vs_later"] = round(rest / typical, 3)
    return result


def main(argv: list[str] | None = None) -> dict:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit(__doc__.splitlines()[2].strip())
    result = epoch_figures(progress_values(Path(args[0])))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
