#!/usr/bin/env bash
# Runs on the GPU machine over binaries built here (carried in .gpu/): the CUDA runtime smoke
# check, the same under compute-sanitizer memcheck, the CUDA runtime tests, and the demo.
# Writes JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/ferrodnn-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export FERRODNN_CACHE_DIR=/tmp/ferrodnn-kernel-cache
rm -rf "$FERRODNN_CACHE_DIR"
echo "== runtime check (cold cache)"
timeout 120 .gpu/ferrodnn gpu-check-runtime --out "$OUT/runtime.json"; echo "rc=$?"
echo "== runtime check (warm disk cache, new process)"
timeout 120 .gpu/ferrodnn gpu-check-runtime --out "$OUT/runtime_warm.json" > /dev/null; echo "rc=$?"
echo "== compute-sanitizer memcheck"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 .gpu/ferrodnn gpu-check-runtime --out "$OUT/runtime_memcheck.json" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
echo "== cuda_runtime tests"
FERRODNN_REQUIRE_NVRTC=1 timeout 120 .gpu/cuda_runtime_tests 2>&1 | tail -5
echo "== demo"
timeout 120 .gpu/ferrodnn demo 2>&1 | tail -12
