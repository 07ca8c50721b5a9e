"""Replays the full sweep of `tune_asha.py` through Ray Tune's own ASHAScheduler, over many trial orders.

    python benchmarks/asha_replay.py [--json benchmarks/tune_asha.json] [--orders 2000]

Asynchronous ASHA's decisions depend on the order in which trials reach a rung: a trial is only
compared with those that reached it before, so the first ones pass every rung. tune_asha.py
measures one order (grid order, one trial at a time). This script feeds the FIFO sweep's
val_bleu histories (every trial trained to the end, so every value ASHA could have seen is
known) to ray.tune.schedulers.ASHAScheduler, built as `nmt tune` builds it, in the grid order,
its reverse and --orders random orders, for several first rungs and reduction factors. It also
replays synchronous successive halving (all trials judged together at each rung, the best
1/factor kept), which does not depend on the order. Prints one JSON line: for each setting the
mean ratio of updates to the full sweep's, the share of orders whose pick is within 1 BLEU of
the best, and the share meeting both targets (within 1 BLEU at no more than 0.5x). Seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

ROOT = Path(__file__).resolve().parent.parent


def replay_asha(histories: list, order: list[int], grace: int, factor: int, max_steps: int) -> tuple[int, int]:
    """(updates spent, index of the trial picked) when the trials run one at a time in `order`."""
    scheduler = ASHAScheduler(time_attr="step", metric="val_bleu", mode="max", max_t=max_steps + 1,
                              grace_period=grace, reduction_factor=factor)
    spent, last = 0, {}
    for index in order:
        trial = SimpleNamespace(trial_id=str(index))
        scheduler.on_trial_add(None, trial)
        for step, bleu in histories[index]:
            last[index] = bleu
            if scheduler.on_trial_result(None, trial, {"step": step, "val_bleu": bleu}) == TrialScheduler.STOP:
                break
        spent += step
    return spent, max(last, key=last.get)  # the best trial: the best last reported val_bleu, as the sweep picks


def replay_sync(histories: list, grace: int, factor: int, max_steps: int) -> tuple[int, int]:
    """(updates spent, trial picked) for synchronous successive halving: all trials judged together at each rung."""
    values = [dict(history) for history in histories]
    alive, rung, spent = list(range(len(histories))), grace, 0
    while rung < max_steps and len(alive) > 1:
        judged_at = {i: min(step for step in values[i] if step >= rung) for i in alive}  # the first validation
        ranked = sorted(alive, key=lambda i: values[i][judged_at[i]], reverse=True)
        alive = ranked[:max(1, len(alive) // factor)]
        spent += sum(judged_at[i] for i in ranked[len(alive):])  # the stopped trials' updates
        rung *= factor
    spent += max_steps * len(alive)
    return spent, max(alive, key=lambda i: values[i][max(values[i])])


def main() -> int:
    """Every setting over the same orders, then the table as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "tune_asha.json",
                        help="a tune_asha.py result (its FIFO val_bleu histories)")
    parser.add_argument("--orders", type=int, default=2000, help="random trial orders to replay")
    parser.add_argument("--rungs", type=int, nargs="+", default=[200, 300, 400], help="first rungs to try")
    parser.add_argument("--factors", type=int, nargs="+", default=[2, 3, 4], help="reduction factors to try")
    args = parser.parse_args()
    result = json.loads(args.json.read_text(encoding="utf-8"))
    trials = result["val_bleu_histories"]["fifo"]
    histories = [history for _, history in trials]  # [[update, val_bleu], ...] per trial
    max_steps = result["updates_per_full_trial"]
    full = len(histories) * max_steps
    final = [history[-1][1] for history in histories]
    best = max(final)
    grid = list(range(len(histories)))
    rng = random.Random(0)
    shuffled = [rng.sample(grid, len(grid)) for _ in range(args.orders)]
    table = []
    for grace in args.rungs:
        for factor in args.factors:
            in_order, reverse = (replay_asha(histories, o, grace, factor, max_steps) for o in (grid, grid[::-1]))
            runs = [replay_asha(histories, order, grace, factor, max_steps) for order in shuffled]
            within = [best - final[pick] <= 1.0 for _, pick in runs]
            met = [ok and spent <= 0.5 * full for ok, (spent, _) in zip(within, runs)]
            sync_spent, sync_pick = replay_sync(histories, grace, factor, max_steps)
            table.append({
                "first_rung": grace, "reduction_factor": factor,
                "asha_grid_order": [round(in_order[0] / full, 3), final[in_order[1]]],
                "asha_reverse_order": [round(reverse[0] / full, 3), final[reverse[1]]],
                "asha_mean_ratio": round(sum(spent for spent, _ in runs) / len(runs) / full, 3),
                "asha_within_1_bleu": round(sum(within) / len(runs), 3),
                "asha_target_met": round(sum(met) / len(runs), 3),
                "sync_ratio": round(sync_spent / full, 3), "sync_pick_val_bleu": final[sync_pick],
                "sync_target_met": best - final[sync_pick] <= 1.0 and sync_spent <= 0.5 * full,
            })
    print(json.dumps({"source": str(args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json),
                      "trials": len(histories), "updates_per_full_trial": max_steps, "best_val_bleu": best,
                      "random_orders": args.orders, "settings": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
