"""`nmt prepare` with data.dedup on a corpus of distinct pairs, as WMT14's are, side by side with another checkout.

The corpus: --pairs training pairs in the hub's wmt/wmt14 Parquet schema, each two or three Multi30k
pairs joined (almost all distinct), prepared with configs/wmt14_en_de.yaml (37k BPE, dedup) by this
checkout and by --baseline-repo (e.g. a git worktree of an earlier commit), in the same run. Prints
one JSON object: wall seconds, driver and workers' peak RSS, pairs kept by each, and the ratio of
seconds (baseline / this).

    git worktree add /tmp/before <commit> && python benchmarks/dedup.py --baseline-repo /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import run_measured  # noqa: E402
from wmt14_rehearsal import generate, multi30k_dir  # noqa: E402


def prepare(repo: Path, corpus: Path, out: Path) -> dict:
    """`nmt prepare` of the corpus by the given checkout: its figures and the training pairs it kept."""
    command = [sys.executable, "-m", "pipeline", "prepare", "--config", "configs/wmt14_en_de.yaml", "-q",
               "--set", f"data.path={corpus}", "--set", f"data.output_dir={out}", "--set", "data.dedup=true"]
    figures = run_measured(command, cwd=repo)
    (manifest,) = out.glob("*/manifest.json")
    return {**figures, "train_pairs_kept": json.loads(manifest.read_text())["splits"]["train"]["pairs"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=450_000, help="training pairs")
    parser.add_argument("--baseline-repo", type=Path, required=True, help="the checkout to compare with")
    args = parser.parse_args(argv)
    if not (multi30k_dir() / "train.en").is_file():
        raise SystemExit(f"Multi30k not found at {multi30k_dir()}; set NMT_MULTI30K_DIR")
    os.environ.pop("RAY_ADDRESS", None)  # each prepare starts a local Ray of its own
    result = {"benchmark": "dedup", "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        corpus = Path(tmp) / "corpus"
        result["corpus"] = generate(str(corpus), args.pairs, 1, seed=14)
        for name, repo in (("this", REPO_ROOT), ("baseline", args.baseline_repo.resolve())):
            result[name] = prepare(repo, corpus, Path(tmp) / f"out-{name}")
            print(f"{name}: {result[name]}", file=sys.stderr)
    result["seconds_baseline_to_this"] = round(result["baseline"]["seconds"] / result["this"]["seconds"], 2)
    result["same_pairs_kept"] = result["baseline"]["train_pairs_kept"] == result["this"]["train_pairs_kept"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
