#!/usr/bin/env bash
# Stock PyTorch on ferrodnn's libcudnn.so.9 (issue 31): scripts/torch_on_capi.py's reference
# pass on NVIDIA's cuDNN, its check pass on ours, and their comparison, each its own process.
#
#   bash scripts/torch_on_capi.sh LIBDIR OUTDIR [ARGS...]
#
# LIBDIR holds our libcudnn.so.9 (scripts/capi_stage.sh leaves it in .gpu/capi); OUTDIR gets
# ref.pt, check.pt, compare.json, the three logs and cudnn_check.log (our library's log of the
# check pass: every failed call with its reason). ARGS go to both passes (--only, --steps,
# --device cpu for a dry run without a GPU). PYTHON picks the interpreter (default python3: the
# one whose torch is to be tested). REF_TIMEOUT and CHECK_TIMEOUT (seconds, default 120 and 400)
# bound the passes: each saves its results after every check, so a pass cut short (or one that
# crashes) still leaves what it ran. Exit status: the comparison's (0 when everything matched).
#
# Why LD_PRELOAD: libtorch_cuda.so asks for libcudnn.so.9 through an RPATH (not RUNPATH) to
# site-packages/nvidia/cudnn/lib, which the loader searches before LD_LIBRARY_PATH, and
# torch/__init__.py loads nvidia/cudnn/lib/libcudnn.so.9 by its full path (ctypes) before
# libtorch_cuda.so. A preloaded library comes first in the search for the name libcudnn.so.9
# and first in the global symbol scope, so libtorch_cuda.so binds every cudnn* call to ours;
# NVIDIA's copy is still mapped (torch loaded it by path) but unused. LD_LIBRARY_PATH is set
# too, for anything that dlopens libcudnn.so.9 by name.
set -uo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 LIBDIR OUTDIR [ARGS...]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
lib=$(cd "$1" && pwd)
out=$2
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
if [[ ! -f "$lib/libcudnn.so.9" ]]; then
    echo "torch_on_capi: $lib/libcudnn.so.9 not found" >&2
    exit 2
fi
rm -f "$out/ref.pt" "$out/check.pt" "$out/compare.json" "$out/cudnn_check.log"

echo "== reference pass (the cuDNN torch loads itself)"
env -u LD_PRELOAD timeout "${REF_TIMEOUT:-120}" "$py" "$here/torch_on_capi.py" --ref "$out/ref.pt" "$@" 2>&1 | tee "$out/ref.log"
echo "reference pass exit status ${PIPESTATUS[0]}"

echo "== check pass (LD_PRELOAD=$lib/libcudnn.so.9)"
LD_PRELOAD="$lib/libcudnn.so.9${LD_PRELOAD:+:$LD_PRELOAD}" \
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-1} CUDNN_LOGDEST_DBG="$out/cudnn_check.log" \
    timeout "${CHECK_TIMEOUT:-400}" "$py" "$here/torch_on_capi.py" --check "$out/check.pt" "$@" 2>&1 | tee "$out/check.log"
echo "check pass exit status ${PIPESTATUS[0]} (a crash leaves check.pt with the checks before it)"

echo "== comparison"
compare=(--compare "$out/ref.pt" "$out/check.pt" --out "$out/compare.json")
"$py" "$here/torch_on_capi.py" "${compare[@]}" 2>&1 | tee "$out/compare.log"
status=${PIPESTATUS[0]}
if [[ -s "$out/cudnn_check.log" ]]; then
    echo "== our library's log ($out/cudnn_check.log): $(wc -l <"$out/cudnn_check.log") lines; the first 40:"
    head -40 "$out/cudnn_check.log"
fi
exit "$status"
