#!/usr/bin/env bash
# The one prepared GPU check, about 9 minutes on one H100 or H200: Multi30k in 5 minutes with
# configs/multi30k_gpu.yaml (tokens/s per epoch, lowercased test2016 BLEU), beam-5 decoding of test2016
# with PyTorch and CTranslate2, and training-step MFU eager and compiled for the base and big presets;
# then, while --deadline (default 540 s) allows, the CUDA tests and today's eager loop for comparison.
#
#   benchmarks/gpu_check.sh OUT_DIR DATA_DIR [--device cuda|cpu] [--quick] [--deadline SECONDS]
#
# DATA_DIR is Multi30k prepared beforehand on any machine (a few MB):
#   nmt prepare --config configs/multi30k_en_de.yaml --set data.output_dir=DATA_DIR
# Needs torch, numpy, pyarrow, sentencepiece, sacrebleu, pyyaml and pytest (ctranslate2 for its
# decoding figure); no Ray, no MLflow. Writes OUT_DIR/gpu_check.json (every step's figures and exit
# status) and OUT_DIR/gpu_check.log. `--device cpu --quick` runs every step small on a CPU, to check
# the script before a GPU run.
set -uo pipefail

usage() { sed -n '7,7p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
OUT=$1 DATA=$2
shift 2
DEVICE=cuda QUICK=0 DEADLINE=540
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    *) usage ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log
: > "$LOG"
rm -f "$OUT"/*.rc "$OUT"/*.out "$OUT"/*.err "$OUT"/*.skipped
START=$SECONDS

# nmt prepare writes OUT/<source>-<hash>/manifest.json: accept either that folder or its parent.
if [ ! -f "$DATA/manifest.json" ]; then
  found=$(ls -d "$DATA"/*/manifest.json 2>/dev/null | head -1)
  [ -n "$found" ] || { echo "gpu_check: no manifest.json in $DATA or a folder under it: run nmt prepare first" >&2; exit 2; }
  DATA=$(dirname "$found")
fi
DATA=$(cd "$DATA" && pwd)  # the cuda tests run torchrun from their own folder

step() {  # step NAME LIMIT_S COMMAND...: stdout to OUT/NAME.out, stderr to NAME.err, both to the log, status to NAME.rc
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  cat "$OUT/$name.err" "$OUT/$name.out" >> "$LOG"
  echo "$rc" > "$OUT/$name.rc"
  echo "== $name: exit $rc after $((SECONDS - START))s" | tee -a "$LOG"
}

fits() {  # fits NAME ESTIMATE_S: whether NAME ends by the deadline; if not, it is recorded as skipped
  if [ $((SECONDS - START + $2)) -gt "$DEADLINE" ]; then
    echo "it would pass the ${DEADLINE}s deadline (at $((SECONDS - START))s, about $2 s more)" > "$OUT/$1.skipped"
    echo "== $1: skipped, $(cat "$OUT/$1.skipped")" | tee -a "$LOG"
    return 1
  fi
}

loop() {  # loop NAME LIMIT_S ARGS...: the worker loop under torchrun (NCCL on a GPU), as gpu_check runs it
  local name=$1 limit=$2
  shift 2
  rm -rf "$OUT/$name-checkpoints"
  step "$name" "$limit" "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m pipeline.train.loop \
    --data "$DATA" --checkpoints "$OUT/$name-checkpoints" --device "$DEVICE" "$@"
}

RECIPE="$ROOT/configs/multi30k_gpu.yaml"
if [ "$QUICK" = 1 ]; then
  # One layer and small batches: compiling on a CPU takes minutes for the whole recipe model. The limits
  # catch a hang, not a slow machine: the test suite runs this check on the cycles its tests leave free.
  BUDGET=10 EVAL_SENTENCES=100 PRESETS="tiny"
  RECIPE_LIMIT=900 EVAL_LIMIT=600 STEP_LIMIT=900 TESTS_LIMIT=900 BASELINE_LIMIT=600 READ_LIMIT=300
  STEP_ARGS="--batch 16 --max-len 16 --steps 2 --rounds 1" BASELINE_SETS="--set train.max_steps=6"
  QUICK_SETS="--set model.num_layers=1 --set train.max_tokens=2048 --set train.val_interval=10 --set train.beam_size=1
    --set train.average_last=2 --set train.log_every=2"
else
  # About 25k target tokens per step (fairseq's WMT14 base recipe), sentences of 32 to 64 tokens.
  BUDGET=300 EVAL_SENTENCES=0 PRESETS="base big"
  RECIPE_LIMIT=450 EVAL_LIMIT=180 STEP_LIMIT=200 TESTS_LIMIT=180 BASELINE_LIMIT=200 READ_LIMIT=30
  STEP_ARGS="--batch 512 --max-len 64 --steps 8 --rounds 2"
  QUICK_SETS="" BASELINE_SETS="--set train.epochs=3"
fi

# 1. Multi30k in 5 minutes: configs/multi30k_gpu.yaml as shipped (compiled, CUDA graphs; its time budget,
#    compiling included, ends in the cooldown). Should the compiled run fail early, it runs again eager.
loop recipe "$RECIPE_LIMIT" --config "$RECIPE" --set train.time_budget_s=$BUDGET $QUICK_SETS
COMPILE_SETS=""
if [ "$(cat "$OUT/recipe.rc")" != 0 ] && [ $((SECONDS - START)) -lt 150 ]; then
  mv "$OUT/recipe.err" "$OUT/recipe_compiled.err"
  mv "$OUT/recipe.rc" "$OUT/recipe_compiled.rc"
  mv "$OUT/recipe.out" "$OUT/recipe_compiled.out"
  COMPILE_SETS="--set train.compile=false"
  loop recipe "$RECIPE_LIMIT" --config "$RECIPE" --set train.time_budget_s=$BUDGET $COMPILE_SETS $QUICK_SETS
fi
step recipe_epochs "$READ_LIMIT" "$PY" "$ROOT/benchmarks/train_log.py" "$OUT/recipe.err"

# 2. Beam-5 test2016 with the run's last (averaged) checkpoint: BLEU, and sentences/s with both engines.
step evaluate "$EVAL_LIMIT" "$PY" "$ROOT/benchmarks/gpu_eval.py" --data "$DATA" \
  --checkpoints "$OUT/recipe-checkpoints" --device "$DEVICE" --beam 5 --limit "$EVAL_SENTENCES" \
  --engines pytorch,ctranslate2

# 3. Training-step throughput and MFU in bf16, eager and compiled side by side (for base also fused Adam
#    and a vocabulary padded to 128 rows), next to nn.Transformer eager.
for preset in $PRESETS; do
  variants=compiled
  [ "$preset" = big ] || variants=fused_adam,vocab_padded,compiled
  if fits "model_step_$preset" 80; then
    step "model_step_$preset" "$STEP_LIMIT" "$PY" "$ROOT/benchmarks/model_step.py" --device "$DEVICE" \
      --preset "$preset" --dtype bf16 $STEP_ARGS --decode-presets "" --variants "$variants"
  fi
done

# 4. While the deadline allows: the cuda-marked tests, then today's loop (configs/multi30k_en_de.yaml,
#    eager, exact batch shapes) for its first epochs, the "before" of step 1's tokens/s per epoch.
if fits cuda_tests 90; then
  step cuda_tests "$TESTS_LIMIT" env NMT_TEST_DEVICE="$DEVICE" NMT_PREPARED_DATA="$DATA" "$PY" -m pytest -m cuda \
    "$ROOT/tests/test_cuda.py" "$ROOT/tests/test_step.py" -q -p no:cacheprovider -o addopts="" -rs
fi
if fits loop_baseline 100; then
  loop loop_baseline "$BASELINE_LIMIT" --config "$ROOT/configs/multi30k_en_de.yaml" --set train.num_workers=1 \
    --set train.max_tokens=8192 --set train.amp=bf16 --set train.log_every=10 --set train.val_interval=100000 \
    --set train.beam_size=1 --set train.average_last=1 $BASELINE_SETS
  step loop_baseline_epochs "$READ_LIMIT" "$PY" "$ROOT/benchmarks/train_log.py" "$OUT/loop_baseline.err"
fi

"$PY" - "$OUT" "$DEVICE" "$QUICK" "$((SECONDS - START))" "$COMPILE_SETS" <<'EOF' | tee -a "$LOG"
import json, pathlib, sys
import torch
out, device, quick, seconds = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
result = {"device": torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else device,
          "torch": torch.__version__, "quick": quick, "seconds": seconds, "steps": {}}
if sys.argv[5]:
    result["recipe_note"] = f"the compiled run failed early (recipe_compiled): the recipe trained with {sys.argv[5]}"
for path in sorted([*out.glob("*.rc"), *out.glob("*.skipped")], key=lambda p: p.stat().st_mtime):
    name = path.stem
    if path.suffix == ".skipped":
        result["steps"][name] = {"skipped": path.read_text().strip()}
        continue
    text = (out / f"{name}.out").read_text(errors="replace").strip()
    entry = {"exit": int(path.read_text())}
    last = text.splitlines()[-1] if text else ""
    try:
        entry.update(json.loads(last))
    except ValueError:
        entry["last_line"] = last[-300:]
    result["steps"][name] = entry
(out / "gpu_check.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
print(json.dumps({k: v.get("exit", "skipped") for k, v in result["steps"].items()}))
EOF
failed=$(cat "$OUT"/*.rc | grep -cv '^0$')
echo "gpu_check: $failed step(s) failed; $OUT/gpu_check.json, $OUT/gpu_check.log" | tee -a "$LOG"
[ "$failed" = 0 ]
