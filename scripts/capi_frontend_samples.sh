#!/usr/bin/env bash
# The cudnn frontend's C++ samples (the header-only library, pinned at FRONTEND_COMMIT) built
# against NVIDIA's cudnn.h and linked against ferrodnn's libcudnn.so.9: every graph call of the
# frontend goes through the backend descriptor API, so this runs that API as the frontend
# drives it. Catch2 is replaced by ferrodnn-cudnn/tests/frontend/catch2 (the few macros the
# samples use), so nothing is fetched.
#
#   bash scripts/capi_frontend_samples.sh          Here (no GPU): the samples' CUDA runtime calls
#                                                  go to tests/frontend/cuda_host.cpp (host
#                                                  memory, an sm_90-like device), and ours runs on
#                                                  its CPU handle (FERRODNN_CUDNN_DEVICE=cpu).
#   bash scripts/capi_frontend_samples.sh --gpu    On the GPU machine: the CUDA toolkit's runtime
#                                                  (nvcc's CUDA_HOME), ours on the GPU; each
#                                                  sample also runs against NVIDIA's libcudnn.so.9
#                                                  (CUDNN_LIB, default the pip wheel's python3
#                                                  finds), side by side.
#
# Environment: FRONTEND (a folder with the frontend's include/, samples/cpp/ and
# samples/legacy_samples/; default
# .gpu/capi/frontend as scripts/capi_stage.sh leaves it, else extracted from FRONTEND_REPO, the
# mirror's bare repository), OURS (a folder with our libcudnn.so.9; default built now, or
# .gpu/capi), CUDNN_INCLUDE (NVIDIA's headers), CUDA_INCLUDE (CPU mode: CUDA runtime headers;
# default the pip wheels of /work/benchenv), SAMPLES (the sample files, relative to
# samples/cpp), JOBS (parallel compilations, default nproc), FILTER (test selection passed to
# each binary, default `~[dynamic_shape]`: ferrodnn plans per shape), LEGACY (1, the default:
# also the legacy samples' binary), OUT (default target/capi_frontend). Exits 1 when a sample
# fails on ours (some do by design: docs/c_api.md lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=0
[[ "${1:-}" == "--gpu" ]] && gpu=1
OUT=${OUT:-target/capi_frontend}
mkdir -p "$OUT"
FRONTEND_COMMIT=${FRONTEND_COMMIT:-3929da2}
FRONTEND_REPO=${FRONTEND_REPO:-/work/.mirror/NVIDIA+cudnn-frontend/repo}
SAMPLES=${SAMPLES:-"convolution/fprop.cpp convolution/dgrads.cpp convolution/wgrads.cpp matmul/matmuls.cpp norm/layernorm.cpp norm/rmsnorm.cpp norm/batchnorm.cpp norm/adaptive_layernorm.cpp misc/pointwise.cpp misc/resample.cpp misc/serialization.cpp sdpa/fp16_fwd.cpp sdpa/fp16_bwd.cpp"}
FILTER=${FILTER:-"~[dynamic_shape]"}
tests=ferrodnn-cudnn/tests/frontend

# The frontend's sources.
if [[ -z "${FRONTEND:-}" ]]; then
    if [[ -d .gpu/capi/frontend/include ]]; then
        FRONTEND=.gpu/capi/frontend
    elif [[ -d "$FRONTEND_REPO" ]]; then
        FRONTEND=$OUT/frontend
        rm -rf "$FRONTEND" && mkdir -p "$FRONTEND"
        git -C "$FRONTEND_REPO" archive "$FRONTEND_COMMIT" include samples/cpp samples/legacy_samples | tar -x -C "$FRONTEND"
    else
        echo "capi_frontend_samples: no frontend sources: set FRONTEND or FRONTEND_REPO" >&2
        exit 1
    fi
fi
FRONTEND=$(cd "$FRONTEND" && pwd)

# NVIDIA's headers.
wheel=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
for d in "${CUDNN_INCLUDE:-}" .gpu/capi/include "$wheel/include" /work/benchenv/venv/lib/python3.11/site-packages/nvidia/cudnn/include /usr/include/x86_64-linux-gnu /usr/include; do
    if [[ -n "$d" && -f "$d/cudnn.h" ]]; then CUDNN_INCLUDE=$(cd "$d" && pwd); break; fi
done
[[ -f "${CUDNN_INCLUDE:-}/cudnn.h" ]] || { echo "capi_frontend_samples: NVIDIA's cudnn.h not found; set CUDNN_INCLUDE" >&2; exit 1; }

# Ours.
if [[ -n "${OURS:-}" ]]; then
    ours=$(cd "$OURS" && pwd)
elif [[ -f .gpu/capi/libcudnn.so.9 ]] && ! command -v cargo >/dev/null; then
    ours=$(cd .gpu/capi && pwd)
else
    bash scripts/capi_build.sh >/dev/null
    ours=$PWD/target/release/cudnn
fi

cxx=${CXX:-g++}
cflags=(-std=c++17 -O1 -w -I"$tests" -I"$FRONTEND/include" -I"$CUDNN_INCLUDE" -include memory -include cudnn_frontend.h)
if [[ $gpu == 1 ]]; then
    cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
    cflags+=(-I"$cuda_home/include")
    runtime=(-L"$cuda_home/lib64" -Wl,-rpath,"$cuda_home/lib64" -lcudart -lnvrtc)
    for d in "${CUDNN_LIB:-}" "$wheel/lib"; do
        if [[ -n "$d" && -f "$d/libcudnn.so.9" ]]; then CUDNN_LIB=$(cd "$d" && pwd); break; fi
    done
    sides=(ours)
    [[ -n "${CUDNN_LIB:-}" && -f "${CUDNN_LIB:-}/libcudnn.so.9" ]] && sides+=(nvidia)
else
    inc=${CUDA_INCLUDE:-"/work/benchenv/venv/lib/python3.11/site-packages/nvidia/cu13/include /work/benchenv/venv/lib/python3.11/site-packages/triton/backends/nvidia/include"}
    cuda_flags=()
    for d in $inc; do cuda_flags+=(-I"$d"); done
    cflags+=("${cuda_flags[@]}")
    "$cxx" -std=c++17 -O1 -c "${cuda_flags[@]}" "$tests/cuda_host.cpp" -o "$OUT/cuda_host.o"
    runtime=("$OUT/cuda_host.o")
    export FERRODNN_CUDNN_DEVICE=cpu
    # No driver here: report a CUDA 12.8 runtime, as the samples check for 12.0 and up.
    export FERRODNN_CUDNN_CUDART_VERSION=${FERRODNN_CUDNN_CUDART_VERSION:-12080}
    sides=(ours)
fi
"$cxx" -std=c++17 -O1 -c -I"$tests" "$tests/catch_main.cpp" -o "$OUT/catch_main.o"

# Every object first, JOBS at a time (each file compiles the whole frontend: tens of seconds).
JOBS=${JOBS:-$(nproc)}
legacy_files="conv_sample test_list fp16_emu helpers fusion_sample fp8_sample norm_samples fused_mha_sample f16_flash_mha_sample fp8_flash_mha_sample"
L=$FRONTEND/samples/legacy_samples
compile() { # source object
    "$cxx" "${cflags[@]}" -I"$L" -c "$1" -o "$2" 2> "${2%.o}.build.err" || rm -f "$2"
}
running=0
sources=()
for s in $SAMPLES; do sources+=("$FRONTEND/samples/cpp/$s:$OUT/$(echo "${s%.cpp}" | tr / _).o"); done
if [[ "${LEGACY:-1}" == 1 && -d "$L" ]]; then
    for f in $legacy_files; do sources+=("$L/$f.cpp:$OUT/legacy_$f.o"); done
fi
for pair in "${sources[@]}"; do
    src=${pair%%:*} obj=${pair#*:}
    [[ -f "$src" ]] || continue
    rm -f "$obj"
    compile "$src" "$obj" &
    running=$((running + 1))
    if [[ $running -ge $JOBS ]]; then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
for s in $SAMPLES; do
    name=$(echo "${s%.cpp}" | tr / _)
    src="$FRONTEND/samples/cpp/$s"
    [[ -f "$src" ]] || { echo "MISSING $s"; failed=1; continue; }
    if [[ ! -f "$OUT/$name.o" ]]; then
        echo "BUILD FAILED $s (see $OUT/$name.build.err)"; failed=1; continue
    fi
    for side in "${sides[@]}"; do
        lib=$ours
        [[ $side == nvidia ]] && lib=$CUDNN_LIB
        "$cxx" "$OUT/$name.o" "$OUT/catch_main.o" "${runtime[@]}" -L"$lib" -l:libcudnn.so.9 -Wl,-rpath,"$lib" -lpthread -ldl -o "$OUT/$name.$side"
        # shellcheck disable=SC2086
        if "$OUT/$name.$side" $FILTER > "$OUT/$name.$side.txt" 2> "$OUT/$name.$side.err"; then status=ok; else status=failures; fi
        echo "== $s ($side): $(tail -1 "$OUT/$name.$side.txt")"
        grep -E "^(FAIL|SKIP)" "$OUT/$name.$side.txt" | sed 's/^/   /' | cut -c1-300 || true
        [[ $side == ours && $status != ok ]] && failed=1
    done
done
# The legacy samples (the frontend's v0.x builder API, as PyTorch's convolutions use it:
# heuristics, global engine indices, fallback lists, cudnnFindPlan autotuning, plan caches,
# several with CPU references): one binary of the files its CMakeLists names.
if [[ "${LEGACY:-1}" == 1 && -d "$FRONTEND/samples/legacy_samples" ]]; then
    objs=()
    ok_build=1
    for f in $legacy_files; do
        if [[ ! -f "$OUT/legacy_$f.o" ]]; then
            echo "BUILD FAILED legacy_samples/$f.cpp (see $OUT/legacy_$f.build.err)"; ok_build=0; failed=1
        fi
        objs+=("$OUT/legacy_$f.o")
    done
    if [[ $ok_build == 1 ]]; then
        for side in "${sides[@]}"; do
            lib=$ours
            [[ $side == nvidia ]] && lib=$CUDNN_LIB
            "$cxx" "${objs[@]}" "$OUT/catch_main.o" "${runtime[@]}" -L"$lib" -l:libcudnn.so.9 -Wl,-rpath,"$lib" -lpthread -ldl -o "$OUT/legacy_samples.$side"
            "$OUT/legacy_samples.$side" > "$OUT/legacy_samples.$side.txt" 2> "$OUT/legacy_samples.$side.err" || true
            echo "== legacy_samples ($side): $(tail -1 "$OUT/legacy_samples.$side.txt")"
            grep -E "^(FAIL|SKIP)" "$OUT/legacy_samples.$side.txt" | sed 's/^/   /' | cut -c1-300 || true
        done
    fi
fi
exit $failed
