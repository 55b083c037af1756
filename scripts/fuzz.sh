#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer on stable Rust (issue 29, item 7).
#
#   scripts/fuzz.sh build            build the targets (fuzz/, instrumented) and write the seeds
#   scripts/fuzz.sh run TARGET SECS  fuzz TARGET for SECS seconds (after `build`); extra args go
#                                    to libFuzzer (e.g. -runs=N, -jobs=N)
#   scripts/fuzz.sh ci SECS          build, then each target for SECS seconds
#
# Targets: graph_json (bytes -> Graph::from_json -> validate -> plan + execute on both CPU
# engines, fuzz/fuzz_targets/graph_json.rs) and python_args (the Python argument layer through
# atheris, python/fuzz/fuzz_args.py; needs the package installed in the venv of scripts/test.sh,
# or PYTHON set to an interpreter that has ferrodnn and atheris).
#
# cargo-fuzz needs nightly for its sanitizers; libFuzzer's coverage needs only SanitizerCoverage,
# which stable rustc emits through the LLVM pass below (no -Z flag). `--target` keeps the flags
# off build scripts and proc macros. Crashes land in fuzz/artifacts/TARGET/, the growing corpus
# in fuzz/corpus/TARGET/ (both ignored by git); a crash is rerun with
# `fuzz/target/x86_64-unknown-linux-gnu/release/graph_json fuzz/artifacts/graph_json/crash-...`.
set -euo pipefail
cd "$(dirname "$0")/.."

TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
BIN="fuzz/target/$TRIPLE/release"
CORPUS="fuzz/corpus"

build() {
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
        cargo build --release --manifest-path fuzz/Cargo.toml --target "$TRIPLE" --bins
    mkdir -p "$CORPUS"
    FERRODNN_FUZZ_WRITE_SEEDS="$CORPUS" "$BIN/graph_json"
}

run() {
    local target="$1" secs="$2"
    shift 2
    mkdir -p "fuzz/artifacts/$target"
    case "$target" in
    graph_json)
        # One thread for the CPU engines: libFuzzer's figures are then per core.
        RAYON_NUM_THREADS=1 "$BIN/graph_json" "$CORPUS/graph_json" -dict="$CORPUS/graph_json.dict" \
            -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
            -artifact_prefix="fuzz/artifacts/graph_json/" "$@"
        ;;
    python_args)
        local py="${PYTHON:-target/pyenv/venv/bin/python}"
        mkdir -p "$CORPUS/python_args"
        RAYON_NUM_THREADS=1 "$py" python/fuzz/fuzz_args.py "$CORPUS/python_args" -max_total_time="$secs" -timeout=20 \
            -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="fuzz/artifacts/python_args/" "$@"
        ;;
    *)
        echo "unknown target $target (graph_json, python_args)" >&2
        exit 2
        ;;
    esac
}

case "${1:-}" in
build) build ;;
run) run "${2:?target}" "${3:?seconds}" "${@:4}" ;;
ci)
    build
    run graph_json "${2:?seconds}"
    run python_args "$2"
    ;;
*)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
