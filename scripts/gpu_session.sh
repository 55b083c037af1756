#!/usr/bin/env bash
# One device call: the GPU check (every op against the CPU engine), the CUDA test binaries,
# the GPU check under compute-sanitizer memcheck, and the benchmark harness beside PyTorch; on
# request (STEPS=...,frontend) the cudnn frontend's own tests beside real cuDNN.
# Runs over binaries built on the development machine and carried in .gpu/ (see
# scripts/stage_gpu.sh). Writes JSON and logs under $OUT.
set -u
OUT=${OUT:-/tmp/ferrodnn-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export FERRODNN_CACHE_DIR=/tmp/ferrodnn-kernel-cache
# Reuse the kernels compiled on an earlier machine (same image, same NVRTC), when carried.
mkdir -p "$FERRODNN_CACHE_DIR"
[ -f .gpu/kcache.tar.gz ] && tar -xzf .gpu/kcache.tar.gz -C "$FERRODNN_CACHE_DIR" && echo "kernel cache: $(ls "$FERRODNN_CACHE_DIR" | wc -l) entries carried in"
SHARDS=${SHARDS:-4}
STEPS=${STEPS:-check,tests,python,memcheck,bench}
if [[ ",$STEPS," == *",check,"* ]]; then
  echo "== gpu-check ($SHARDS processes)"
  for i in $(seq 0 $((SHARDS - 1))); do
    timeout 500 .gpu/ferrodnn gpu-check --shard "$i/$SHARDS" --out "$OUT/gpu_check_$i.json" ${FILTER:+--filter "$FILTER"} > "/tmp/gpu_check_$i.log" 2>&1 &
  done
  wait
  cat /tmp/gpu_check_*.log > "$OUT/gpu_check.log"
  grep -h "^gpu-check:" /tmp/gpu_check_*.log; grep -h "^FAIL" /tmp/gpu_check_*.log | head -40
  echo "PASS lines: $(grep -c '^PASS' "$OUT/gpu_check.log")"
fi
if [[ ",$STEPS," == *",tests,"* ]]; then
  echo "== CUDA runtime check and tests"
  timeout 120 .gpu/ferrodnn gpu-check-runtime --out "$OUT/runtime.json" | tail -1
  for t in .gpu/test_*; do FERRODNN_REQUIRE_NVRTC=1 FERRODNN_SM90_SMALL_ONLY=1 timeout 200 "$t" 2>&1 | grep -E "test result|FAILED|panicked" ; done
fi
if [[ ",$STEPS," == *",python,"* ]]; then
  echo "== Python package on the GPU (PyTorch references)"
  rm -rf /tmp/fdnn && pip install -q --no-index --target /tmp/fdnn .gpu/wheels/ferrodnn-*.whl 2>&1 | tail -2
  python3 -c "import pytest, looseversion" 2>/dev/null || pip install -q --no-index --target /tmp/fdnn .gpu/wheels/deps/*.whl 2>&1 | tail -2
  (cd python/tests && PYTHONPATH=/tmp/fdnn timeout 300 python3 -m pytest -q -rs -p no:cacheprovider . > "$OUT/pytest.log" 2>&1; tail -15 "$OUT/pytest.log")
fi
if [[ ",$STEPS," == *",memcheck,"* ]]; then
  echo "== compute-sanitizer memcheck on gpu-check"
  for i in $(seq 0 $((SHARDS - 1))); do
    timeout 500 compute-sanitizer --tool memcheck --error-exitcode 3 .gpu/ferrodnn gpu-check --shard "$i/$SHARDS" ${MEMCHECK_FILTER:+--filter "$MEMCHECK_FILTER"} > "/tmp/memcheck_$i.log" 2>&1 &
  done
  wait
  cat /tmp/memcheck_*.log > "$OUT/memcheck.log"
  grep -hE "ERROR SUMMARY|^gpu-check:" /tmp/memcheck_*.log
fi
if [[ ",$STEPS," == *",racecheck,"* ]]; then
  echo "== compute-sanitizer racecheck on the fast kernels"
  for i in $(seq 0 $((SHARDS - 1))); do
    timeout 400 compute-sanitizer --tool racecheck --error-exitcode 3 .gpu/ferrodnn gpu-check --shard "$i/$SHARDS" --filter "${RACECHECK_FILTER:-fast_}" > "/tmp/racecheck_$i.log" 2>&1 &
  done
  wait
  cat /tmp/racecheck_*.log > "$OUT/racecheck.log"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|^gpu-check:" /tmp/racecheck_*.log
fi
if [[ ",$STEPS," == *",bench,"* ]]; then
  # cuDNN's own graph API (cudnn-frontend), when its wheel was staged: the gemm suite's third column.
  if ls .gpu/wheels/cudnnfe/*.whl > /dev/null 2>&1; then
    pip install -q --no-index --no-deps --target /tmp/cudnnfe .gpu/wheels/cudnnfe/*.whl 2>&1 | grep -v WARNING | tail -2
    export PYTHONPATH="/tmp/cudnnfe${PYTHONPATH:+:$PYTHONPATH}"
  fi
  for suite in ${SUITES:-memory-bound gemm attention}; do
    echo "== bench $suite"
    FERRODNN_COMMIT=$(cat .gpu/COMMIT 2>/dev/null) timeout 400 python3 bench/run.py --ferrodnn .gpu/ferrodnn --out "$OUT" --suite "$suite" ${SKIP_COLD:+--skip-cold} > "$OUT/bench-$suite.log" 2>&1
    echo "bench $suite rc=$?"; grep -vE '^\s' "$OUT/bench-$suite.log" | tail -${BENCH_TAIL:-16}
  done
fi
if [[ ",$STEPS," == *",conv,"* ]]; then
  # The conv suite, then PyTorch (cuDNN) on the same layers: batches of calls, and CUDA-graph
  # replay (kernels alone).
  echo "== conv suite beside PyTorch"
  timeout 300 .gpu/ferrodnn bench --suite conv ${CONV_FILTER:+--filter "$CONV_FILTER"} --out "$OUT/conv_ours.json" > "$OUT/conv_ours.log" 2>&1
  echo "conv rc=$?"; grep -vE '^\s' "$OUT/conv_ours.log" | tail -30
  if ls .gpu/wheels/cudnnfe/*.whl > /dev/null 2>&1; then
    pip install -q --no-index --no-deps --target /tmp/cudnnfe .gpu/wheels/cudnnfe/*.whl 2>&1 | grep -v WARNING | tail -2
    CUDNN_GRAPH="--cudnn-graph"
  fi
  PYTHONPATH="/tmp/cudnnfe${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 bench/torch_conv.py --ours "$OUT/conv_ours.json" --out "$OUT/conv_torch.json" ${CUDNN_GRAPH:-}
  timeout 200 python3 bench/torch_conv.py --ours "$OUT/conv_ours.json" --out "$OUT/conv_torch_graphs.json" --graphs
fi
if [[ ",$STEPS," == *",ab,"* ]]; then
  # A/B of tuning switches, ferrodnn alone: the suite $AB_SUITE once per environment in $AB
  # (';'-separated, each a space-separated list of VAR=value, e.g. AB="FERRODNN_PDL=0;FERRODNN_PDL=1").
  IFS=';' read -ra variants <<< "${AB:-}"
  for v in "${variants[@]}"; do
    echo "-- $v"
    env $v timeout 150 .gpu/ferrodnn bench --suite "${AB_SUITE:-attention}" ${AB_FILTER:+--filter "$AB_FILTER"} --out "$OUT/ab_${v// /_}.json" 2>&1 | grep -vE '^\s' | tail -${BENCH_TAIL:-16}
  done
fi
if [[ ",$STEPS," == *",abbin,"* ]]; then
  # A/B of two builds, ferrodnn alone: .gpu/ferrodnn_base (the build before a change, staged by
  # hand) against .gpu/ferrodnn, suites $AB_SUITES, interleaved rounds (bench/ab.py).
  echo "== A/B of .gpu/ferrodnn_base and .gpu/ferrodnn"
  timeout ${AB_TIMEOUT:-450} python3 -u bench/ab.py --a .gpu/ferrodnn_base --b .gpu/ferrodnn --rounds "${AB_ROUNDS:-3}" --runs "${AB_RUNS:-30}" \
    $(for s in ${AB_SUITES:-memory-bound attention gemm}; do echo --suite "$s"; done) --out "$OUT/abbin" > "$OUT/abbin.log" 2>&1
  echo "ab rc=$?"; cat "$OUT/abbin.log" | tail -${BENCH_TAIL:-120}
fi
if [[ ",$STEPS," == *",probe,"* ]]; then
  echo "== sm90 GEMM probe (configurations beside torch.matmul)"
  FERRODNN_SM90_TIMING=1 timeout 300 .gpu/test_cuda_sm90 --nocapture 2>&1 | grep -E "^chosen|TFLOP|    bn|panicked|test result" | tail -40
fi
if [[ ",$STEPS," == *",frontend,"* ]]; then
  # The cudnn frontend's own Python tests (staged by `scripts/frontend_suite.py stage` into
  # .gpu/frontend_tests), once with real cuDNN and once with ferrodnn as `cudnn`.
  echo "== the cudnn frontend's tests: real cuDNN beside ferrodnn"
  rm -rf /tmp/fdnn /tmp/fsdeps && pip install -q --no-index --no-deps --target /tmp/fdnn .gpu/wheels/ferrodnn-*.whl 2>&1 | grep -v WARNING | tail -2
  pip install -q --no-index --no-deps --target /tmp/cudnnfe .gpu/wheels/cudnnfe/*.whl 2>&1 | grep -v WARNING | tail -2
  pip install -q --no-index --no-deps --target /tmp/fsdeps .gpu/wheels/deps/*.whl 2>&1 | grep -v WARNING | tail -2
  timeout "${FRONTEND_TIMEOUT:-570}" python3 -u scripts/frontend_suite.py run --tests .gpu/frontend_tests --cudnn-path /tmp/cudnnfe --ferrodnn-path /tmp/fdnn \
    --extra-path /tmp/fsdeps --parallel "${FRONTEND_PARALLEL:-4}" --deadline "${FRONTEND_DEADLINE:-480}" --timeout "${FRONTEND_FILE_TIMEOUT:-240}" \
    --out "$OUT/frontend.json" ${FRONTEND_FILES:+--files $FRONTEND_FILES} > "$OUT/frontend.log" 2>&1
  echo "frontend rc=$?"; tail -"${FRONTEND_TAIL:-40}" "$OUT/frontend.log"
fi
# Send the kernel cache back for the next machine.
tar -czf "$OUT/kcache.tar.gz" -C "$FERRODNN_CACHE_DIR" . 2>/dev/null && ls -la "$OUT/kcache.tar.gz"
# At most 8 files come back: everything else in one archive.
(cd "$OUT" && tar -czf /tmp/results.tar.gz --exclude=kcache.tar.gz . && find . -mindepth 1 ! -name kcache.tar.gz -delete && mv /tmp/results.tar.gz results.tar.gz && ls -la)
