#!/usr/bin/env bash
# Per-kernel durations (ncu, SpeedOfLight) of the first launches of conv bench workloads: which
# of a plan's kernels (staging copies, GEMM, split-k reduce) take the time. W: space-separated
# workload ids (substrings) of the conv suite; COUNT: kernels captured per workload.
set -u
export FERRODNN_CACHE_DIR=/tmp/ferrodnn-kernel-cache
mkdir -p $FERRODNN_CACHE_DIR; tar -xzf .gpu/kcache.tar.gz -C $FERRODNN_CACHE_DIR 2>/dev/null
for w in ${W:-conv_wgrad_fp16_nhwc_32x256x14x14_k256_3x3s1}; do
  echo "== $w"
  timeout 120 ncu --section SpeedOfLight -c "${COUNT:-6}" .gpu/ferrodnn bench --suite "${SUITE:-conv}" --filter "$w" --runs 1 > "$OUT/ncu_$w.txt" 2>&1
  grep -E "^  n[0-9]+_|^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|DRAM Throughput|Grid Size|Block Size" "$OUT/ncu_$w.txt" | head -40
done
