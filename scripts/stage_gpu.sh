#!/usr/bin/env bash
# Build here and stage what the device machine runs into .gpu/ (ignored by git; name it in carry).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mkdir -p .gpu && rm -f .gpu/test_*
cp target/release/ferrodnn .gpu/
for t in cuda_engine cuda_runtime; do
  bin=$(cargo test --release --no-run --test "$t" 2>&1 | grep -o "target/release/deps/$t-[0-9a-f]*" | head -1)
  cp "$bin" ".gpu/test_$t"
done
git rev-parse HEAD > .gpu/COMMIT
ls -la .gpu
