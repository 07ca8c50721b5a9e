"""docs/benchmarks.md's headline table and the tracking server guide's load table, generated from
benchmarks/results.json: every figure has one source.

    python tools/benchmark_table.py          # print the markdown tables
    python tools/benchmark_table.py --write  # replace the blocks between the pages' markers

`make bench` (benchmarks/run_all.py) writes it after each run; tests/test_readme.py checks that
docs/benchmarks.md holds exactly this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
PAGE = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- benchmark-table:start -->", "<!-- benchmark-table:end -->"
LOAD_PAGE = ROOT / "deploy" / "tracking-server.md"
LOAD_START, LOAD_END = "<!-- tracking-load-table:start -->", "<!-- tracking-load-table:end -->"

# One row per headline: the script, what it measures, then ours, the baseline of the same run and
# the ratio, each a str.format template over results.json ({script[key][subkey]}).
HEADLINES = [
    ("model_step", "training step, tiny preset, target tokens/s",
     "{model_step[train_tokens_per_s]:,.0f}",
     "`nn.Transformer` of the same size: {model_step[nn_transformer_tokens_per_s]:,.0f}",
     "{model_step[train_speed_ratio]:.2f}x"),
    ("model_step", "greedy decoding, base preset, sentences/s",
     "cached: {model_step[decode][base][sentences_per_s_cached]:.1f}",
     "uncached: {model_step[decode][base][sentences_per_s_uncached]:.1f}",
     "{model_step[decode][base][cache_speedup]:.1f}x"),
    ("gpu_check", "training step on one H200 (torch {gpu_check[torch]}), base preset, bf16, target tokens/s (MFU)",
     "{gpu_check[base_bf16_eager][train_tokens_per_s]:,.0f} ({gpu_check[base_bf16_eager][mfu]:.1%}); compiled, "
     "in a second call: {gpu_check[base_bf16_compiled][train_tokens_per_s]:,.0f} "
     "({gpu_check[base_bf16_compiled][mfu]:.1%})",
     "`nn.Transformer` of the same size: {gpu_check[base_bf16_eager][nn_transformer_tokens_per_s]:,.0f}; "
     "compiled: {gpu_check[base_bf16_compiled][nn_transformer_tokens_per_s]:,.0f}",
     "{gpu_check[base_bf16_eager][train_speed_ratio]:.2f}x; "
     "compiled {gpu_check[base_bf16_compiled][train_speed_ratio]:.2f}x"),
    ("gpu_check", "training step on one H200 (torch {gpu_check[torch]}), big preset, bf16, target tokens/s (MFU)",
     "{gpu_check[big_bf16_eager][train_tokens_per_s]:,.0f} ({gpu_check[big_bf16_eager][mfu]:.1%})",
     "`nn.Transformer` of the same size: {gpu_check[big_bf16_eager][nn_transformer_tokens_per_s]:,.0f}",
     "{gpu_check[big_bf16_eager][train_speed_ratio]:.2f}x"),
    ("peer_hf", "training at identical size, target tokens/s",
     "{peer_hf[train_tokens_per_s][ours]:,}", "HF MarianMT: {peer_hf[train_tokens_per_s][hf]:,}",
     "{peer_hf[train_ratio]:.2f}x"),
    ("peer_hf", "beam 5 at identical size, generated tokens/s",
     "{peer_hf[beam5_tokens_per_s][ours]:,}; CTranslate2 int8: {peer_hf[beam5_tokens_per_s][ct2_int8]:,}",
     "HF MarianMT: {peer_hf[beam5_tokens_per_s][hf]:,}",
     "{peer_hf[beam5_ratio_ours]:.2f}x; {peer_hf[beam5_ratio_ct2_int8]:.2f}x"),
    ("peer_hf", "greedy at identical size, generated tokens/s",
     "{peer_hf[greedy_tokens_per_s][ours]:,}; CTranslate2 int8: {peer_hf[greedy_tokens_per_s][ct2_int8]:,}",
     "HF MarianMT: {peer_hf[greedy_tokens_per_s][hf]:,}",
     "{peer_hf[greedy_ratio_ours]:.2f}x; {peer_hf[greedy_ratio_ct2_int8]:.2f}x"),
    ("batching", "padding efficiency on Multi30k at `max_tokens` 4096",
     "token-budget batches: {batching[token_budget][padding_efficiency]:.3f}",
     "random batches: {batching[random][padding_efficiency]:.3f}",
     "{batching[padded_tokens_saved]:.0%} fewer tokens to compute"),
    ("prepare", "Ray Data preparation, Multi30k train x 32 (930k pairs), pairs/s",
     "{prepare[repeat_32][ray][rows_per_s]:,}",
     "the same task function in one process: {prepare[repeat_32][single_process][rows_per_s]:,}",
     "{prepare[repeat_32][speedup]:.2f}x best, {prepare[repeat_32][speedup_median_of_pairs]:.2f}x median of pairs"),
    ("train_overhead", "training loop under Ray Train, 1 worker, tokens/s",
     "{train_overhead[ray_1_worker][tokens_per_s]:,.0f}", "bare process: {train_overhead[bare][tokens_per_s]:,.0f}",
     "{train_overhead[ratios][ray_1_worker_over_bare]:.2f}x"),
    ("train_overhead", "2 workers on 2 cores, tokens/s",
     "{train_overhead[ray_2_workers][tokens_per_s]:,.0f}",
     "1 worker: {train_overhead[ray_1_worker][tokens_per_s]:,.0f}",
     "{train_overhead[ratios][ray_2_workers_over_ray_1_worker]:.2f}x"),
    ("tune_asha", "updates a sweep spends",
     "ASHA: {tune_asha[asha_updates]:,} (kept a {tune_asha[asha_pick_val_bleu_full]:.2f}-BLEU config)",
     "every trial to the end: {tune_asha[fifo_updates]:,} (best {tune_asha[best_val_bleu_full]:.2f})",
     "{tune_asha[asha_over_fifo_updates]:.2f}x"),
    ("dedup", "`nmt prepare` with dedup, 200k distinct WMT14-shaped pairs, seconds",
     "per-block marking: {dedup[this][seconds]:.0f}",
     "one Python call per pair (`map_groups`): {dedup[baseline][seconds]:.0f}",
     "{dedup[seconds_baseline_to_this]:.1f}x faster, the same {dedup[this][train_pairs_kept]:,} pairs kept"),
    ("spot_rehearsal", "updates lost when a spot node is reclaimed (20 s notice, checkpoints every 20 updates)",
     "checkpoint on the notice: {spot_rehearsal[notice][updates_lost]}",
     "periodic checkpoints only: {spot_rehearsal[none][updates_lost]}",
     "resumed from update {spot_rehearsal[notice][resumed_from]}, the last one made"),
    ("wmt14_rehearsal", "`nmt prepare` of WMT14-sized hub Parquet on S3, largest process of the command's tree, MiB",
     "4.5M pairs: {wmt14_rehearsal[prepare_large][driver_peak_rss_mib]:,} "
     "in {wmt14_rehearsal[prepare_large][seconds]:.0f} s",
     "450k pairs: {wmt14_rehearsal[prepare_small][driver_peak_rss_mib]:,} "
     "in {wmt14_rehearsal[prepare_small][seconds]:.0f} s",
     "{wmt14_rehearsal[driver_rss_ratio_large_to_small]:.2f}x for 10x the pairs"),
    ("cli_exit", "`nmt train` of 40 updates: seconds from its last line to the end of the process",
     "{cli_exit[median][nmt][tail_s]:.2f}", "CPython's usual exit: {cli_exit[median][usual_exit][tail_s]:.2f}",
     "the whole command {cli_exit[wall_ratio_nmt_over_usual]:.2f}x as long"),
    ("tracking_load", "one MLflow server with logins, 256 concurrent trials on 2 shared cores: requests failed, "
                      "points lost, p99 request",
     "PostgreSQL: {tracking_load[by_level][postgresql_256][request_errors]:,} failed, "
     "{tracking_load[by_level][postgresql_256][lost_points]:,} lost, "
     "p99 {tracking_load[by_level][postgresql_256][p99_s]:.2f} s",
     "SQLite: {tracking_load[by_level][sqlite_256][request_errors]:,} failed, "
     "{tracking_load[by_level][sqlite_256][lost_points]:,} lost, "
     "p99 {tracking_load[by_level][sqlite_256][p99_s]:.2f} s",
     "p99 {tracking_load[p99_sqlite_over_postgresql_256]:.0f}x lower (at 512 both saturate the cores: "
     "deploy/tracking-server.md)"),
    ("serve", "translation service at 16 clients, sentences/s",
     "dynamic batching: {serve[batched_sentences_per_s]:.1f}; "
     "CTranslate2 int8: {serve[ctranslate2_int8_batched_sentences_per_s]:.1f}",
     "batch size 1: {serve[batch_1_sentences_per_s]:.1f}",
     "{serve[speedup]:.1f}x; CTranslate2 {serve[ctranslate2_over_pytorch_batched]:.2f}x PyTorch batched"),
]
SCRIPT_FILES = {"gpu_check": "gpu_check.sh"}  # results.json keys whose script is not `<key>.py`


def headline_markdown(results: dict) -> str:
    """The headline rows whose benchmark is in results, as one markdown table."""
    lines = ["| benchmark (run on) | measure | ours | baseline in the same run | ratio |", "|---|---|---|---|---|"]
    for script, measure, *cells in HEADLINES:
        if script in results:
            day = results[script].get("date", "date not recorded")
            figures = " | ".join(cell.format(**results) for cell in cells)
            what = measure.format(**results)
            lines.append(f"| `{SCRIPT_FILES.get(script, script + '.py')}` ({day}) | {what} | {figures} |")
    return "\n".join(lines)


def tracking_load_markdown(results: dict) -> str:
    """benchmarks/tracking_load.py's levels as a table: each load on SQLite, then on PostgreSQL."""
    load = results["tracking_load"]
    lines = ["| concurrent trials | backend store | trials failed | runs left unfinished | requests failed | "
             "points lost (of logged) | p50 / p99 / max request, s | requests/s |", "|---|---|---|---|---|---|---|---|"]
    for level in sorted(load["levels"], key=lambda lv: (lv["trials"], lv["store"] != "sqlite")):
        store = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[level["store"]]
        lines.append(f"| {level['trials']} | {store} | {level['trial_errors']} | {level['runs_not_finished']} | "
                     f"{level['request_errors']:,} | "
                     f"{level['lost_points']:,} (of {level['points_queued']:,}) | {level['p50_s']:.2f} / "
                     f"{level['p99_s']:.2f} / {level['max_s']:.1f} | {level['requests_per_s']:.0f} |")
    return "\n".join(lines)


def _replace_block(page: Path, start: str, end: str, table: str) -> None:
    """Put the table between the page's markers (temporary file, then rename)."""
    text = page.read_text(encoding="utf-8")
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    partial = page.with_suffix(".md.tmp")
    partial.write_text(f"{head}{start}\n{table}\n{end}{tail}", encoding="utf-8")
    partial.replace(page)


def write_table(page: Path = PAGE, results: Path = RESULTS) -> None:
    """Regenerate the headline table (and the tracking load table, when results has it)."""
    found = json.loads(results.read_text(encoding="utf-8"))
    _replace_block(page, START, END, headline_markdown(found))
    if "tracking_load" in found and page == PAGE:
        _replace_block(LOAD_PAGE, LOAD_START, LOAD_END, tracking_load_markdown(found))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_table()
    else:
        found = json.loads(RESULTS.read_text(encoding="utf-8"))
        print(headline_markdown(found))
        if "tracking_load" in found:
            print("\n" + tracking_load_markdown(found))
