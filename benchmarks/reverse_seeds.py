"""The reverse-sequence test's exact match over several seeds: the spread its floor must stay under.

    python benchmarks/reverse_seeds.py [--seeds 8] [--threads N]

Prints one JSON object: each seed's exact match, the lowest, and the test's floor. CPUs differ
(AVX-512, AMX kernels round differently), so run it on a new kind of machine before raising the floor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_model_training import REVERSE_FLOOR, reverse_exact_match  # noqa: E402


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, as make test trains)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    exact = {seed: reverse_exact_match(seed) for seed in range(args.seeds)}
    result = {"exact_match": exact, "lowest": min(exact.values()), "floor": REVERSE_FLOOR}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
