#!/usr/bin/env bash
# One device call: the GPU check (every op against the CPU engine), the CUDA test binaries,
# the GPU check under compute-sanitizer memcheck, and the benchmark harness beside PyTorch.
# Runs over binaries built on the development machine and carried in .gpu/ (see
# scripts/stage_gpu.sh). Writes JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/ferrodnn-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export FERRODNN_CACHE_DIR=/tmp/ferrodnn-kernel-cache
STEPS=${STEPS:-check,tests,memcheck,bench}
if [[ ",$STEPS," == *",check,"* ]]; then
  echo "== gpu-check"
  timeout 300 .gpu/ferrodnn gpu-check --out "$OUT/gpu_check.json" ${FILTER:+--filter "$FILTER"} > "$OUT/gpu_check.log" 2>&1
  echo "gpu-check rc=$?"; grep -v '^PASS' "$OUT/gpu_check.log" | tail -40
fi
if [[ ",$STEPS," == *",tests,"* ]]; then
  echo "== CUDA runtime check and tests"
  timeout 120 .gpu/ferrodnn gpu-check-runtime --out "$OUT/runtime.json" | tail -1
  for t in .gpu/test_*; do FERRODNN_REQUIRE_NVRTC=1 timeout 120 "$t" 2>&1 | grep -E "test result|FAILED|panicked" ; done
fi
if [[ ",$STEPS," == *",memcheck,"* ]]; then
  echo "== compute-sanitizer memcheck on gpu-check"
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 3 .gpu/ferrodnn gpu-check ${MEMCHECK_FILTER:+--filter "$MEMCHECK_FILTER"} > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|gpu-check:" "$OUT/memcheck.log" | tail -3
fi
if [[ ",$STEPS," == *",bench,"* ]]; then
  echo "== bench"
  FERRODNN_COMMIT=$(cat .gpu/COMMIT 2>/dev/null) timeout 400 python3 bench/run.py --ferrodnn .gpu/ferrodnn --out "$OUT" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -vE '^\s' "$OUT/bench.log" | tail -25
fi
