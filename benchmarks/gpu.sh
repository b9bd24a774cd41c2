#!/usr/bin/env bash
# The prepared GPU run (issue 10): on a CUDA machine with the project's environment, in under 8 minutes,
#   1. python -m attnbook.selfcheck            every backend x dtype vs float64, and what "auto" picks
#   2. benchmarks/gpu_tables.py                forward and backward tables, fp16/bf16, D 64/128,
#                                              T 1024..16384, causal and not, Triton vs SDPA (flash); a memory table
#   3. pytest -m gpu tests/                    the GPU tests
#   4. pytest tests/lib/test_triton_flash.py tests/lib/test_trust.py tests/lib/test_selfcheck.py -m "not gpu"
#                                              the Triton tests and the first-use check on the GPU
# and writes $OUT (default benchmarks/gpu_results.md, raw rows in .json beside it): a section ready to
# paste into benchmarks/RESULTS.md (GPU name, date, torch/triton versions, targets, tables, checks).
# Each stage has its own time limit and the benchmarks a time budget, so the whole run stays under
# TOTAL seconds (default 470); a stage that fails or times out is recorded and the run goes on.
#
# Usage: bash benchmarks/gpu.sh [--dry-run] [--out FILE]
#   --dry-run   on any machine (no GPU needed): print the plan, run the table writer on tiny CPU
#               sizes and a one-line self-check, skip the GPU tests; used by tests/book/test_gpu_script.py.
# Environment: PYTHON (default .venv/bin/python, else python3), OUT, TOTAL, BUDGET (benchmark seconds
#   after which no new table starts; default 150, 0 in a dry run), LOGDIR (full logs; default a temp dir).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
DRY=0
OUT=${OUT:-benchmarks/gpu_results.md}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) shift; OUT=$1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TOTAL=${TOTAL:-470}
if [ "$DRY" = 1 ]; then BUDGET=${BUDGET:-0}; else BUDGET=${BUDGET:-150}; fi
LOGDIR=${LOGDIR:-$(mktemp -d -t attnbook-gpu-XXXXXX)}
mkdir -p "$LOGDIR" "$(dirname "$OUT")"
unset TRITON_INTERPRET          # the kernels must run on the GPU, not in the CPU interpreter
STAGES="$LOGDIR/stages.md"
: > "$STAGES"
STAGE_NO=0
LAST_LOG=

left() { echo $(( TOTAL - SECONDS )); }

# stage NAME LIMIT COMMAND...: run with a time limit (never past TOTAL), log, record status and time
stage() {
  local name=$1 limit=$2; shift 2
  local rest; rest=$(left)
  if [ "$limit" -gt $(( rest - 5 )) ]; then limit=$(( rest - 5 )); fi
  if [ "$limit" -lt 10 ]; then
    echo "| $name | not run: the ${TOTAL} s total was spent | 0 |" >> "$STAGES"
    echo "[gpu.sh] $name: not run (time spent)" >&2
    return 0
  fi
  STAGE_NO=$(( STAGE_NO + 1 ))
  local log="$LOGDIR/stage$STAGE_NO.log"
  LAST_LOG=$log
  echo "[gpu.sh] $name (limit ${limit} s): $*" >&2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$? status
  case $rc in
    0) status="passed" ;;
    124|137) status="timed out after ${limit} s" ;;
    *) status="failed (exit status $rc)" ;;
  esac
  local summary; summary=$(grep -E '^(=+ .* =+|[0-9]+ (passed|failed).*)$' "$log" | tail -1 | tr -d '=' | sed 's/^ *//')
  echo "| $name | $status${summary:+: $summary} | $(( SECONDS - t0 )) |" >> "$STAGES"
  echo "[gpu.sh] $name: $status ($(( SECONDS - t0 )) s; log $log)" >&2
  return 0
}

echo "[gpu.sh] python: $PYTHON; output: $OUT; logs: $LOGDIR; total limit ${TOTAL} s; benchmark budget ${BUDGET} s" >&2
if [ "$DRY" = 0 ]; then
  if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: torch sees no CUDA GPU here; run with --dry-run to check the script on a CPU" >&2
    exit 2
  fi
  command -v nvidia-smi > /dev/null && nvidia-smi -L >&2
  stage "python -m attnbook.selfcheck" 100 "$PYTHON" -m attnbook.selfcheck
  SELFCHECK_LOG=$LAST_LOG
  stage "benchmarks/gpu_tables.py" $(( BUDGET + 60 )) "$PYTHON" benchmarks/gpu_tables.py --out "$OUT" --budget "$BUDGET"
  stage "pytest -m gpu tests/" 60 "$PYTHON" -m pytest -q -m gpu tests/
  # (-k: the test that runs this script's dry run is not repeated from inside it)
  stage "pytest triton + trust + selfcheck tests on the GPU" 100 \
    "$PYTHON" -m pytest -q -m "not gpu" tests/lib/test_triton_flash.py tests/lib/test_trust.py tests/lib/test_selfcheck.py
else
  cat >&2 <<EOF
[gpu.sh] dry run: on a GPU the stages would be
  python -m attnbook.selfcheck                                    (limit 100 s)
  python benchmarks/gpu_tables.py --out $OUT --budget 150         (limit 210 s)
  python -m pytest -q -m gpu tests/                               (limit 60 s)
  python -m pytest -q -m "not gpu" tests/lib/test_triton_flash.py tests/lib/test_trust.py tests/lib/test_selfcheck.py
                                                                  (limit 100 s; all within TOTAL=470 s)
EOF
  stage "python -m attnbook.selfcheck (dry run: tiled, float32)" 120 \
    "$PYTHON" -m attnbook.selfcheck --backends tiled --dtypes float32 --device cpu
  SELFCHECK_LOG=$LAST_LOG
  stage "benchmarks/gpu_tables.py --dry-run" 240 \
    "$PYTHON" benchmarks/gpu_tables.py --dry-run --out "$OUT" --budget "$BUDGET"
fi

# The checks of this run, appended to the tables (or written alone if the tables failed).
if [ ! -s "$OUT" ]; then
  echo "## GPU run, $(date -u +%Y-%m-%d): no benchmark tables (see the checks below)" > "$OUT"
fi
{
  echo
  echo "### Checks in this run (benchmarks/gpu.sh$( [ "$DRY" = 1 ] && echo ' --dry-run'), $(date -u '+%Y-%m-%d %H:%M UTC'), ${SECONDS} s in all)"
  echo
  echo "| stage | result | seconds |"
  echo "|---|---|---|"
  cat "$STAGES"
  if [ -s "${SELFCHECK_LOG:-/nonexistent}" ]; then
    echo
    echo "Output of the self-check:"
    echo
    echo '```text'
    cat "$SELFCHECK_LOG"
    echo '```'
  fi
} >> "$OUT"
echo "[gpu.sh] wrote $OUT in ${SECONDS} s" >&2
