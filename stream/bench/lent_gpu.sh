#!/usr/bin/env bash
# Issue 67's GPU figures on a lent device machine, in the two calls of ../shared/gpu/README.md's recipe (a call
# carries at most 64 MiB, so the MiniLM weights come in two parts). Here, first: bash ../shared/gpu/prepare.sh. Then:
#   call 1, carrying .gpu/whl and .gpu/a:  bash stream/bench/lent_gpu.sh setup    (about a minute)
#   call 2, carrying .gpu/b:               bash stream/bench/lent_gpu.sh measure  (timeout_s 580; at most 9 min)
# on the same warm machine. Everything lands in $OUT (the device tool's folder; ./lent-gpu-out when unset): the
# versions, the CUDA tests' log, the text benchmark's JSON (rewritten after each row, so a run stopped by the device's
# time keeps the rows it finished) and log, the MLP benchmark's. The most wanted figures run first: the packed
# encoder with CUDA graphs (never measured through the worker), then packed eager, then the MLP.
# Counts: TEXTS (the model alone's and sentence-transformers' passes, 51,200), DRAIN (texts per worker drain,
# 2,000,000: about 15 s at 130,000 texts/s), ROUNDS (worker drains per row, 3), BATCH (4,096), EVENTS (the MLP's,
# 500,000). `measure --check` runs every step with small counts on a machine without CUDA (the text benchmark then
# has no CUDA rows): it checks the script, not the figures. A failed or skipped step does not stop the later ones;
# `measure` then exits 1, and $OUT/steps.log says which.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:-}
OUT=${OUT:-$PWD/lent-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
failed=0
left() { echo "$(( ${DEADLINE:-999999} - SECONDS ))"; }
step() {  # step NAME SECONDS COMMAND...: at most SECONDS (and never past the deadline), its output in $OUT/NAME.log
  local name=$1 limit=$2 rc
  shift 2
  (( limit > $(left) )) && limit=$(left)
  if (( limit < 20 )); then
    echo "== $name: not run ($(left) s left)" | tee -a "$OUT/steps.log"
    failed=1
    return
  fi
  echo "== $name (at most $limit s): $*" | tee -a "$OUT/steps.log"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  (( rc == 0 )) || failed=1
  echo "== $name: exit $rc after $SECONDS s in all" | tee -a "$OUT/steps.log"
  tail -25 "$OUT/$name.log"
}

case "$phase" in
  setup)
    test -d .gpu/whl -a -d .gpu/a || { echo "carry .gpu/whl and .gpu/a (bash ../shared/gpu/prepare.sh here)"; exit 2; }
    bash .gpu/setup.sh
    ;;
  measure)
    check=${2:-}
    if [[ $check == --check ]]; then
      TEXTS=${TEXTS:-512} DRAIN=${DRAIN:-2048} ROUNDS=${ROUNDS:-1} BATCH=${BATCH:-256} EVENTS=${EVENTS:-5000}
      PY=${PY/python3/.venv/bin/python}
      [[ -x $PY ]] || PY=python3
    else
      test -d .gpu/b || { echo "carry .gpu/b (the MiniLM weights' second part)"; exit 2; }
      bash .gpu/minilm.sh || exit 1
    fi
    DEADLINE=${DEADLINE:-540}
    {
      date -u +%FT%TZ
      git rev-parse --short HEAD 2>/dev/null || echo "no git here"
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
      "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")'
      nproc
    } >"$OUT/versions.txt" 2>&1
    cat "$OUT/versions.txt"
    step pytest 90 "$PY" -m pytest -q -p no:cacheprovider -o filterwarnings=default tests/unit/models/test_minilm.py \
      -k "cuda or packed or warm or graph or bucket"
    step bench-text 330 "$PY" -m stream bench-text --broker tansu --no-cpu --torch-threads 8 \
      --cuda-texts "${TEXTS:-51200}" --cuda-drain-texts "${DRAIN:-2000000}" --cuda-batches "${BATCH:-4096}" \
      --cuda-dtypes bfloat16 --cuda-variants packed-graphs,packed --cuda-drains packed-graphs,packed \
      --no-host-ceiling --worker-rounds "${ROUNDS:-3}" --stages-rounds 0 --results "$OUT/bench-text"
    step bench-gpu 90 "$PY" -m stream bench-gpu --broker tansu --width 8192 --depth 4 --events "${EVENTS:-500000}" \
      --results "$OUT/bench-gpu"
    exit "$failed"
    ;;
  *)
    echo "usage: bash stream/bench/lent_gpu.sh setup | measure [--check]" >&2
    exit 2
    ;;
esac
