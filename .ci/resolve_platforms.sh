#!/usr/bin/env bash
# Does `pip install "torch==2.13.0" -e ".[all]"` (README's quick start) resolve on the platforms
# a home server may be? uv resolves pyproject.toml for another platform than this one, with the
# environment markers evaluated for that platform (pip's --platform evaluates them for this
# machine, so a pip dry-run cannot answer). NNI 3.0 has x86-64 wheels only: it must be in the
# x86-64 resolution and out of the aarch64 Linux (Raspberry Pi 4/5, Jetson, ARM servers) and
# Apple-silicon macOS ones, where REFT prunes with torch-pruning.
#
#   bash .ci/resolve_platforms.sh [PROJECT_DIR]
#
# Exit 1 when a platform is unsatisfiable or NNI is where it should not be; exit 0 with a
# "skipped" line when uv cannot be installed or the package index cannot be reached.
set -euo pipefail
PROJECT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
TORCH_PIN="torch==2.13.0"  # README's quick start
WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgefl-resolve.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
skip() { echo "resolve_platforms: skipped: $*"; exit 0; }

UV=$(command -v uv || true)
if [ -z "$UV" ]; then
    if ! { python3 -m venv "$WORK/uv" && "$WORK/uv/bin/python" -m pip install -q uv; } >"$WORK/pip.log" 2>&1; then
        skip "could not install uv from the package index ($(tail -1 "$WORK/pip.log"))"
    fi
    UV=$WORK/uv/bin/uv
fi
echo "$TORCH_PIN" > "$WORK/pin.txt"

failed=0
# platform, Python, whether NNI belongs in the resolution
for case in "x86_64-manylinux_2_28 3.11 nni" "aarch64-manylinux_2_28 3.11 -" "aarch64-manylinux_2_28 3.10 -" \
            "aarch64-apple-darwin 3.11 -"; do
    read -r platform python want_nni <<< "$case"
    out=$WORK/$platform-$python.txt
    # torch 2.13's macOS wheel is macosx_14_0_arm64; uv's default macOS target is older
    if MACOSX_DEPLOYMENT_TARGET=14.0 "$UV" pip compile "$PROJECT/pyproject.toml" "$WORK/pin.txt" --extra all \
            --python-platform "$platform" --python-version "$python" --quiet --output-file "$out" \
            >"$WORK/uv.log" 2>&1; then
        rc=0
    else
        rc=$?
    fi
    if [ "$rc" != 0 ]; then
        if grep -q "No solution found" "$WORK/uv.log"; then
            echo "resolve_platforms: FAILED: edgefl[all] + $TORCH_PIN is unsatisfiable on $platform (Python $python):"
            sed 's/^/    /' "$WORK/uv.log"
            failed=1
            continue
        fi
        skip "uv could not reach the package index (exit $rc): $(grep -m1 -i "error" "$WORK/uv.log" || tail -1 "$WORK/uv.log")"
    fi
    pins=$(grep -cE '^[A-Za-z0-9_.-]+==' "$out" || true)
    has_nni=$(grep -qiE '^nni==' "$out" && echo nni || echo -)
    tp=$(grep -iE '^torch-pruning==' "$out" || echo "no torch-pruning")
    if [ "$has_nni" != "$want_nni" ]; then
        echo "resolve_platforms: FAILED: $platform (Python $python): NNI expected '$want_nni', resolved '$has_nni'"
        failed=1
    else
        echo "resolve_platforms: ok: $platform (Python $python): $pins packages, $(grep -E '^torch==' "$out"), $tp," \
             "$([ "$has_nni" = nni ] && echo "with nni==3.0" || echo "without NNI")"
    fi
done
exit "$failed"
