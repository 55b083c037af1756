#!/usr/bin/env bash
# Stages the C API's comparison for the GPU machine (which has no cargo) into .gpu/capi (ignored
# by git; carry .gpu): our libcudnn.so.9, the GPU-path test binary, and, when this machine has
# them, NVIDIA's cudnn*.h. There:
#   .gpu/capi/test_gpu
#   OURS=.gpu/capi CUDNN_INCLUDE=.gpu/capi/include bash scripts/capi_compare.sh --gpu
#   OURS=.gpu/capi CUDNN_INCLUDE=.gpu/capi/include bash scripts/capi_frontend_samples.sh --gpu
#   PYTHON=<PyTorch's venv>/bin/python bash scripts/torch_on_capi.sh .gpu/capi .gpu/torch_on_capi
#     (stock PyTorch on .gpu/capi/libcudnn.so.9 against NVIDIA's; docs/c_api.md, "PyTorch on
#     the library"; the scripts are tracked files, only the library needs carrying)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/capi_build.sh >/dev/null
mkdir -p .gpu/capi
cp target/release/cudnn/libcudnn.so.9 .gpu/capi/
# The Rust test of the GPU path (GPU handle vs CPU handle on the same calls): run .gpu/capi/test_gpu.
bin=$(cargo test --release -p ferrodnn-cudnn --test gpu --no-run 2>&1 | grep -o "target/release/deps/gpu-[0-9a-f]*" | head -1)
cp "$bin" .gpu/capi/test_gpu
inc=${CUDNN_INCLUDE:-/work/benchenv/venv/lib/python3.11/site-packages/nvidia/cudnn/include}
if [[ -f "$inc/cudnn.h" ]]; then
    rm -rf .gpu/capi/include && mkdir -p .gpu/capi/include && cp "$inc"/cudnn*.h .gpu/capi/include/
fi
# The cudnn frontend's headers and C++ samples, for scripts/capi_frontend_samples.sh --gpu
# (the GPU machine has no network), from the mirror of its repository at the pinned commit.
repo=${FRONTEND_REPO:-/work/.mirror/NVIDIA+cudnn-frontend/repo}
if [[ -d "$repo" ]]; then
    rm -rf .gpu/capi/frontend && mkdir -p .gpu/capi/frontend
    git -C "$repo" archive "${FRONTEND_COMMIT:-3929da2}" include samples/cpp samples/legacy_samples | tar -x -C .gpu/capi/frontend
fi
ls -la .gpu/capi
