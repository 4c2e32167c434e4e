#!/usr/bin/env bash
# The GPU block as one command: the CUDA-marked tests, then every benchmark on cuda, all output into one folder.
#
#   benchmarks/gpu_check.sh [OUT_DIR] [--quick] [--only TOPIC ...]
#
# OUT_DIR (default runs/gpu/, ignored by git) receives device.txt (GPU, driver, torch), cuda-tests.log + .xml (pytest -m cuda),
# bench.log and RESULTS.md: a copy of benchmarks/RESULTS.md to which run_all.py adds (or replaces) this GPU's block,
# beside the CPU block — copy it back over benchmarks/RESULTS.md to record the figures. run_all.py runs every
# bench_*.py, bench_precision.py included: its table gains a "float32 + TF32" column on CUDA (each method's error
# against float64 with TF32 matmuls off and on, then bfloat16 and float16), and a copy of that table goes to
# precision.md. Without a CUDA device it
# stops at once (exit 2) and runs nothing. PY selects the interpreter (default: .venv/bin/python, else python).
# Exit status: 0 when the tests and every benchmark passed, 1 otherwise (the benchmarks run even if a test failed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=runs/gpu
if [[ $# -gt 0 && $1 != --* ]]; then OUT=$1; shift; fi
if [[ -z ${PY:-} ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
fi
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "$PY" -c "import torch; print(f'gpu_check: torch {torch.__version__} (CUDA build: {torch.version.cuda or \"none\"}) '
                              'sees no CUDA device; nothing was run', flush=True)" >&2 \
    || echo "gpu_check: cannot import torch with $PY" >&2
  exit 2
fi

mkdir -p "$OUT"
{ "$PY" -c "import torch; print(torch.cuda.get_device_name(0), '| CUDA', torch.version.cuda, '| torch', torch.__version__)"
  nvidia-smi 2>/dev/null || true; } > "$OUT/device.txt"
cat "$OUT/device.txt"

status=0
"$PY" -m pytest tests -m cuda -q -rs -p no:cacheprovider --junitxml="$OUT/cuda-tests.xml" 2>&1 \
  | tee "$OUT/cuda-tests.log" || status=1
if grep -q "SKIPPED" "$OUT/cuda-tests.log"; then
  echo "gpu_check: some CUDA tests were skipped on a machine with CUDA (see cuda-tests.log)" >&2; status=1
fi

cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
"$PY" benchmarks/run_all.py --device cuda --output "$OUT/RESULTS.md" "$@" 2>&1 | tee "$OUT/bench.log" || status=1
# the precision table alone, for the RESULTS.md section on precision (the same rows as in the block above)
sed -n '/<!-- machine: cuda-/,/<!-- end machine: cuda-/p' "$OUT/RESULTS.md" \
  | sed -n '/<!-- bench: bench_precision -->/,/<!-- end bench: bench_precision -->/p' > "$OUT/precision.md"
echo "gpu_check: results in $OUT/ (exit $status)"
exit $status
