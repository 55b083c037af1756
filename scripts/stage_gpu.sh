#!/usr/bin/env bash
# Build here and stage what the device machine runs into .gpu/ (ignored by git; name it in carry):
# the CLI, the CUDA test binaries, the Python wheel (with pytest's wheels), and, when NVRTC is
# available here, a kernel cache filled for the H100 (sm_90a, 132 SMs) by `compile-cases`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mkdir -p .gpu && rm -f .gpu/test_*
cp target/release/ferrodnn .gpu/
for t in cuda_engine cuda_runtime cuda_sm90; do
  bin=$(cargo test --release --no-run --test "$t" 2>&1 | grep -o "target/release/deps/$t-[0-9a-f]*" | head -1)
  cp "$bin" ".gpu/test_$t"
done
if [ "${WHEEL:-1}" = 1 ]; then
  bash python/build_wheel.sh > /dev/null
  rm -rf .gpu/wheels && mkdir -p .gpu/wheels && cp -r target/wheels/* .gpu/wheels/
fi
# cuDNN's Python frontend for the device's Python (3.12), for bench/run.py's cuDNN column.
if [ "${CUDNN_FRONTEND:-1}" = 1 ]; then
  mkdir -p .gpu/wheels/cudnnfe
  python3 -m pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 -d .gpu/wheels/cudnnfe nvidia-cudnn-frontend || echo "cudnn-frontend wheel not downloaded"
fi
if [ -n "${KCACHE_DIR:-}" ]; then
  tar -czf .gpu/kcache.tar.gz -C "$KCACHE_DIR" .
fi
git rev-parse HEAD > .gpu/COMMIT
du -sh .gpu; ls .gpu
