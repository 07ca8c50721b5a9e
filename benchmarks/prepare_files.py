"""Driver memory of `nmt prepare` on text files as the corpus grows: Ray tasks read the files, not the driver.

Writes Multi30k's training split repeated --small and --large times (validation and test as they
are) as plain text files, runs `nmt prepare --config configs/multi30k_en_de.yaml` on each in a
subprocess and prints one JSON object: wall seconds, the driver's peak RSS, the Ray workers' peak
RSS summed, and the driver-RSS ratio of the large corpus to the small one (1.0: flat). With
--baseline-repo, the large corpus is prepared by that checkout too (e.g. a git worktree of an
earlier commit), in the same run:

    python benchmarks/prepare_files.py                         # 435k and 4.35M pairs: ~10 min on 2 cores
    git worktree add /tmp/before <commit> && python benchmarks/prepare_files.py --baseline-repo /tmp/before
    python benchmarks/prepare_files.py --dedup                 # the large corpus once more with data.dedup=true
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


def default_data_dir() -> Path:
    """$NMT_MULTI30K_DIR when set, else the shared copy next to the repository."""
    return Path(os.environ.get("NMT_MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))


def write_corpus(multi30k: Path, times: int, out: Path) -> int:
    """Multi30k with its training split repeated `times` times, as <out>/{train,val,test_2016_flickr}.{en,de}."""
    out.mkdir(parents=True)
    for lang in ("en", "de"):
        train = (multi30k / f"train.{lang}").read_bytes()
        with open(out / f"train.{lang}", "wb") as handle:
            for _ in range(times):
                handle.write(train)
        for stem in ("val", "test_2016_flickr"):
            (out / f"{stem}.{lang}").write_bytes((multi30k / f"{stem}.{lang}").read_bytes())
    return sum(1 for _ in open(out / "train.en", "rb"))


def prepare(repo: Path, corpus: Path, output_dir: Path, *settings: str) -> dict:
    """`nmt prepare` of the corpus with the given checkout's code (and --set settings): its measured figures."""
    command = [sys.executable, "-m", "pipeline", "prepare", "--config", "configs/multi30k_en_de.yaml", "-q",
               "--set", f"data.path={corpus}", "--set", f"data.output_dir={output_dir}",
               *(arg for setting in settings for arg in ("--set", setting))]
    return run_measured(command, cwd=repo)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(), help="Multi30k's folder")
    parser.add_argument("--small", type=int, default=15, help="repeats of the training split, small corpus")
    parser.add_argument("--large", type=int, default=150, help="repeats of the training split, large corpus")
    parser.add_argument("--baseline-repo", type=Path, help="another checkout to prepare the large corpus with")
    parser.add_argument("--dedup", action="store_true",
                        help="also prepare the large corpus with data.dedup=true (every training pair repeats)")
    args = parser.parse_args(argv)
    if not (args.data_dir / "train.en").is_file():
        raise SystemExit(f"Multi30k not found at {args.data_dir}; pass --data-dir or set NMT_MULTI30K_DIR")
    result = {"benchmark": "prepare_files", "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-prepare-files-") as tmp:
        for name, times in (("small", args.small), ("large", args.large)):
            corpus = Path(tmp) / f"corpus-{times}"
            pairs = write_corpus(args.data_dir, times, corpus)
            figures = prepare(REPO_ROOT, corpus, Path(tmp) / f"out-{times}")
            result[name] = {"train_pairs": pairs, "corpus_mib": round(sum(
                f.stat().st_size for f in corpus.iterdir()) / 2**20), **figures}
            print(f"{name}: {result[name]}", file=sys.stderr)
        if args.dedup:
            corpus, out = Path(tmp) / f"corpus-{args.large}", Path(tmp) / "out-dedup"
            result["large_dedup"] = prepare(REPO_ROOT, corpus, out, "data.dedup=true")
            (manifest,) = out.glob("*/manifest.json")
            result["large_dedup"]["train_pairs_kept"] = json.loads(manifest.read_text())["splits"]["train"]["pairs"]
            print(f"dedup: {result['large_dedup']}", file=sys.stderr)
        if args.baseline_repo:
            corpus = Path(tmp) / f"corpus-{args.large}"
            result["baseline_large"] = prepare(args.baseline_repo.resolve(), corpus, Path(tmp) / "out-baseline")
            print(f"baseline: {result['baseline_large']}", file=sys.stderr)
    large, small = result["large"]["peak_rss_mib"], result["small"]["peak_rss_mib"]
    result["driver_rss_ratio_large_to_small"] = round(large / small, 2)
    if args.baseline_repo:
        result["driver_rss_baseline_to_this"] = round(result["baseline_large"]["peak_rss_mib"] / large, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
