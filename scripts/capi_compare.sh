#!/usr/bin/env bash
# The C API's test programs (ferrodnn-cudnn/tests/c/*.c), built against NVIDIA's cudnn.h.
#
#   bash scripts/capi_compare.sh          Here (no GPU): build each program against ours only, on
#                                         ferrodnn's CPU handle with host pointers, and run it.
#   bash scripts/capi_compare.sh --gpu    On the GPU machine: build each program twice with -DGPU
#                                         (device pointers), linked once against NVIDIA's
#                                         libcudnn.so.9 and once against ours, run both, and
#                                         compare every printed number within tolerance.
#
# Environment: CUDNN_INCLUDE (the folder of NVIDIA's cudnn.h) and, for --gpu, CUDNN_LIB (the
# folder of NVIDIA's libcudnn.so.9); both default to the nvidia-cudnn pip wheel's folders that
# python3 finds (PyTorch's copy, or `pip install nvidia-cudnn-cu12`), then /usr/include and the
# system library folder (CUDNN_INCLUDE may be .gpu/capi/include, staged by capi_stage.sh).
# RTOL and ATOL (default 1e-4, 1e-5: fp32 with FMA math on both sides; a program may name its own
# in a "capi_compare: rtol=... atol=..." comment, as the half-precision one does) set the
# tolerance of |ours - nvidia| <= ATOL + RTOL * |nvidia|. OUT (default target/capi_compare) holds
# the binaries and their outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=0
[[ "${1:-}" == "--gpu" ]] && gpu=1
RTOL=${RTOL:-1e-4}
ATOL=${ATOL:-1e-5}
OUT=${OUT:-target/capi_compare}
mkdir -p "$OUT"

wheel=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
for d in "${CUDNN_INCLUDE:-}" "$wheel/include" /work/benchenv/venv/lib/python3.11/site-packages/nvidia/cudnn/include /usr/include/x86_64-linux-gnu /usr/include; do
    if [[ -n "$d" && -f "$d/cudnn.h" ]]; then CUDNN_INCLUDE=$d; break; fi
done
[[ -f "${CUDNN_INCLUDE:-}/cudnn.h" ]] || { echo "capi_compare: NVIDIA's cudnn.h not found; set CUDNN_INCLUDE" >&2; exit 1; }
echo "cudnn.h from $CUDNN_INCLUDE"

# Ours: OURS (a folder with a libcudnn.so.9 built by scripts/capi_build.sh, such as the one
# scripts/capi_stage.sh puts in .gpu/capi for a machine without cargo), else built now.
if [[ -n "${OURS:-}" ]]; then
    ours=$(cd "$OURS" && pwd)
else
    bash scripts/capi_build.sh >/dev/null
    ours=$PWD/target/release/cudnn
fi
[[ -f "$ours/libcudnn.so.9" ]] || { echo "capi_compare: no libcudnn.so.9 in $ours" >&2; exit 1; }
tests=ferrodnn-cudnn/tests/c
# cudnn.h includes cuda_runtime_api.h for a few types: tests/c/cuda_stub declares them, so no
# CUDA toolkit is needed; device memory comes from the driver (libcuda) in -DGPU builds.
cflags=(-O1 -std=c11 -Wall -Wno-deprecated-declarations -I"$CUDNN_INCLUDE" -I"$tests/cuda_stub")
programs=(conv conv_half conv_bias_act activation softmax pooling tensor_ops batchnorm dropout lrn backend_conv rnn errors)

if [[ $gpu == 0 ]]; then
    for p in "${programs[@]}"; do
        cc "${cflags[@]}" "$tests/$p.c" -o "$OUT/$p.ours" -L"$ours" -l:libcudnn.so.9 -Wl,-rpath,"$ours" -ldl -lm
        "$OUT/$p.ours" > "$OUT/$p.ours.txt" 2> "$OUT/$p.ours.err" || { echo "FAIL $p (see $OUT/$p.ours.err)"; cat "$OUT/$p.ours.err"; exit 1; }
        echo "ran  $p: $(grep -vc '^#' "$OUT/$p.ours.txt") values ($(head -1 "$OUT/$p.ours.err"))"
    done
    exit 0
fi

for d in "${CUDNN_LIB:-}" "$wheel/lib" /usr/lib/x86_64-linux-gnu; do
    if [[ -n "$d" && -f "$d/libcudnn.so.9" ]]; then CUDNN_LIB=$d; break; fi
done
[[ -f "${CUDNN_LIB:-}/libcudnn.so.9" ]] || { echo "capi_compare: NVIDIA's libcudnn.so.9 not found; set CUDNN_LIB" >&2; exit 1; }
echo "NVIDIA's libcudnn.so.9 from $CUDNN_LIB; ours from $ours"
# f32 stays f32 in NVIDIA's library too (no TF32 behind an engine that notes tensor cores).
export NVIDIA_TF32_OVERRIDE=0
failed=0
for p in "${programs[@]}"; do
    for side in nvidia ours; do
        lib=$CUDNN_LIB
        [[ $side == ours ]] && lib=$ours
        cc "${cflags[@]}" -DGPU "$tests/$p.c" -o "$OUT/$p.$side" -L"$lib" -l:libcudnn.so.9 -Wl,-rpath,"$lib" -l:libcuda.so.1 -ldl -lm
        if ! "$OUT/$p.$side" > "$OUT/$p.$side.txt" 2> "$OUT/$p.$side.err"; then
            echo "FAIL $p ($side did not run: $OUT/$p.$side.err)"; cat "$OUT/$p.$side.err"; failed=1; continue 2
        fi
    done
    # A program may name its own tolerance (half precision): "capi_compare: rtol=... atol=...".
    rtol=$(grep -o 'capi_compare: rtol=[^ ]*' "$tests/$p.c" | cut -d= -f2 || true)
    atol=$(grep -o 'capi_compare: rtol=[^ ]* atol=[^ ]*' "$tests/$p.c" | sed 's/.*atol=//' || true)
    if python3 - "$OUT/$p.nvidia.txt" "$OUT/$p.ours.txt" "${rtol:-$RTOL}" "${atol:-$ATOL}" <<'PY'
import sys
a, b = open(sys.argv[1]).read().split("\n"), open(sys.argv[2]).read().split("\n")
rtol, atol = float(sys.argv[3]), float(sys.argv[4])
if len(a) != len(b):
    print(f"  {len(a)} lines from NVIDIA's, {len(b)} from ours"); sys.exit(1)
worst, bad = 0.0, []
for la, lb in zip(a, b):
    if la.startswith("#") or not la:
        if la != lb: bad.append(f"section {la!r} vs {lb!r}")
        continue
    na, ia, va = la.split(); nb, ib, vb = lb.split()
    va, vb = float(va), float(vb)
    err = abs(va - vb)
    worst = max(worst, err / (atol + rtol * abs(va)))
    if (na, ia) != (nb, ib) or not err <= atol + rtol * abs(va):
        bad.append(f"{na}[{ia}]: NVIDIA {va!r}, ours {vb!r}")
print(f"  worst error {worst:.3f} of the tolerance")
for m in bad[:10]: print("  " + m)
sys.exit(1 if bad else 0)
PY
    then echo "PASS $p"; else echo "FAIL $p"; failed=1; fi
done
exit $failed
