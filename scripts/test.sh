#!/usr/bin/env bash
# The tests: the Rust workspace, then the Python package (built from python/ and installed into a
# virtual environment under target/) with its pytest suite. A second run reuses both builds.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --release

PYTHON="${PYTHON:-python3}"
VENV="$PWD/target/pyenv/venv"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check maturin numpy pytest
export PATH="$VENV/bin:$PATH"
# pip builds python/ in place (release, abi3), so python/target keeps the Rust build between runs.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation ./python
"$VENV/bin/python" -m pytest python/tests -q
