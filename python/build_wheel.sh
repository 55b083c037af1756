#!/usr/bin/env bash
# Build the abi3 wheel (and the wheels of pytest and looseversion, which the cudnn frontend's tests
# import, for a machine with no network) into target/wheels,
# to install elsewhere with `pip install --no-index --target DIR target/wheels/ferrodnn-*.whl`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$PWD/target/pyenv/venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check maturin
rm -f target/wheels/ferrodnn-*.whl
(cd python && "$VENV/bin/maturin" build --release -o ../target/wheels)
"$VENV/bin/python" -m pip download --quiet --disable-pip-version-check -d target/wheels/deps pytest looseversion
ls target/wheels target/wheels/deps
