#!/usr/bin/env bash
# Builds ferrodnn's libcudnn.so.9 (cuDNN's C API on ferrodnn) into target/release/cudnn/, with the
# soname and the symbol version (libcudnn.so.9) of NVIDIA's library, and libcudnn.so beside it
# for linking with -lcudnn. Usage: bash scripts/capi_build.sh [--debug]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
flag=--release
if [[ "${1:-}" == "--debug" ]]; then profile=debug; flag=; fi
# The crate as a static library, so that the link below uses our version script alone (rustc's
# own, for a cdylib, would hide the symbol versions).
cargo rustc $flag -p ferrodnn-cudnn --lib --crate-type staticlib >&2
out=target/$profile/cudnn
mkdir -p "$out"
${CC:-cc} -shared -o "$out/libcudnn.so.9" \
  -Wl,-soname,libcudnn.so.9 -Wl,--version-script=ferrodnn-cudnn/libcudnn.map -Wl,--gc-sections \
  -Wl,--whole-archive "target/$profile/libferrodnn_cudnn.a" -Wl,--no-whole-archive \
  -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
ln -sf libcudnn.so.9 "$out/libcudnn.so"
echo "$out/libcudnn.so.9"
