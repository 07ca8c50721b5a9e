#!/usr/bin/env bash
# The one prepared GPU check: CUDA tests, training-step MFU, a 5-minute Multi30k run, GPU decoding,
# then compiled training steps while --deadline (default 480 s) allows.
#
#   benchmarks/gpu_check.sh OUT_DIR DATA_DIR [--device cuda|cpu] [--quick] [--deadline SECONDS]
#
# DATA_DIR is Multi30k prepared beforehand on any machine (a few MB):
#   nmt prepare --config configs/multi30k_en_de.yaml --set data.output_dir=DATA_DIR
# Needs torch, numpy, pyarrow, sentencepiece, sacrebleu, pyyaml and pytest; no Ray, no MLflow.
# Writes OUT_DIR/gpu_check.json (every step's figures and exit status) and OUT_DIR/gpu_check.log.
# `--device cpu --quick` runs every step small on a CPU, to check the script before a GPU run.
set -uo pipefail

usage() { sed -n '4,5p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
OUT=$1 DATA=$2
shift 2
DEVICE=cuda QUICK=0 DEADLINE=480
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
rm -f "$OUT"/*.rc "$OUT"/*.out "$OUT"/*.err
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

if [ "$QUICK" = 1 ]; then
  PRESETS="tiny" STEP_ARGS="--batch 16 --max-len 16 --steps 2 --rounds 1" BUDGET=10 COMPILE_LIMIT=300 COMPILE_ESTIMATE=0
  TRAIN_SETS="--set train.beam_size=1 --set train.val_interval=20 --set train.average_last=2" EVAL_LIMIT=100
else
  # About 25k target tokens per batch (fairseq's WMT14 base recipe), sentences of 32 to 64 tokens.
  PRESETS="base big" STEP_ARGS="--batch 512 --max-len 64 --steps 8 --rounds 2" BUDGET=300 COMPILE_LIMIT=120 COMPILE_ESTIMATE=60
  TRAIN_SETS="--set train.val_interval=1000" EVAL_LIMIT=0
fi

# 1. The cuda-marked tests (NMT_TEST_DEVICE=cpu runs them on the CPU).
step cuda_tests 150 env NMT_TEST_DEVICE="$DEVICE" NMT_PREPARED_DATA="$DATA" \
  "$PY" -m pytest -m cuda "$ROOT/tests/test_cuda.py" -q -p no:cacheprovider -o addopts="" -rs

# 2. Training-step throughput and MFU in bf16 next to nn.Transformer, eager.
for preset in $PRESETS; do
  step "model_step_${preset}_eager" 60 "$PY" "$ROOT/benchmarks/model_step.py" --device "$DEVICE" --preset "$preset" \
    --dtype bf16 $STEP_ARGS --decode-presets ""
done

# 3. The Multi30k sweep's best config (configs/multi30k_en_de.yaml) for a fixed wall-clock budget under torchrun (NCCL on a GPU), bf16.
rm -rf "$OUT/run"
step train $((BUDGET + 120)) "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m pipeline.train.loop \
  --config "$ROOT/configs/multi30k_en_de.yaml" --data "$DATA" --checkpoints "$OUT/run" --device "$DEVICE" \
  --set train.time_budget_s=$BUDGET --set train.epochs=1000 --set train.max_tokens=4096 --set train.amp=bf16 \
  --set train.log_every=100 $TRAIN_SETS

# 4. Beam-5 test2016 with the run's last (averaged) checkpoint: BLEU and decoding sentences/s.
step evaluate 120 "$PY" "$ROOT/benchmarks/gpu_eval.py" --data "$DATA" --checkpoints "$OUT/run" \
  --train-log "$OUT/train.err" --device "$DEVICE" --beam 5 --limit "$EVAL_LIMIT"

# 5. The same with torch.compile, while the deadline allows (compiling takes about a minute per model pair).
for preset in $PRESETS; do
  if [ $((SECONDS - START + COMPILE_ESTIMATE)) -gt "$DEADLINE" ]; then
    echo "== model_step_${preset}_compiled: skipped, it would pass the ${DEADLINE}s deadline" | tee -a "$LOG"
    continue
  fi
  step "model_step_${preset}_compiled" "$COMPILE_LIMIT" "$PY" "$ROOT/benchmarks/model_step.py" --device "$DEVICE" \
    --preset "$preset" --dtype bf16 $STEP_ARGS --decode-presets "" --compile
done

"$PY" - "$OUT" "$DEVICE" "$QUICK" "$((SECONDS - START))" <<'EOF' | tee -a "$LOG"
import json, pathlib, sys
import torch
out, device, quick, seconds = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
result = {"device": torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else device,
          "torch": torch.__version__, "quick": quick, "seconds": seconds, "steps": {}}
for rc_file in sorted(out.glob("*.rc"), key=lambda p: p.stat().st_mtime):
    name, text = rc_file.stem, (out / f"{rc_file.stem}.out").read_text(errors="replace").strip()
    entry = {"exit": int(rc_file.read_text())}
    last = text.splitlines()[-1] if text else ""
    try:
        entry.update(json.loads(last))
    except ValueError:
        entry["last_line"] = last[-300:]
    result["steps"][name] = entry
(out / "gpu_check.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
print(json.dumps({k: v.get("exit") for k, v in result["steps"].items()}))
EOF
failed=$(cat "$OUT"/*.rc | grep -cv '^0$')
echo "gpu_check: $failed step(s) failed; $OUT/gpu_check.json, $OUT/gpu_check.log" | tee -a "$LOG"
[ "$failed" = 0 ]
