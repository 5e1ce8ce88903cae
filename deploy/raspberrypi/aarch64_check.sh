#!/usr/bin/env bash
# The edge SDK on a 64-bit ARM CPU, without one: an arm64 Debian Python under qemu-user,
# with the SDK and its dependencies installed from PyPI's aarch64 wheels, registers with an
# x86 coordinator over loopback and trains federated rounds on real digits.
#
#   sudo deploy/raspberrypi/aarch64_check.sh [--cpu cortex-a72] [--torch SPEC] [--rounds N] [--work DIR]
#   sudo deploy/raspberrypi/aarch64_check.sh --coordinator [--cpu cortex-a72] [--torch SPEC] [--work DIR]
#   sudo deploy/raspberrypi/aarch64_check.sh --onnx DIR [--cpu cortex-a72] [--work DIR]
#
# --cpu cortex-a72 is the Raspberry Pi 4's core (ARMv8.0, no LSE atomics): torch builds that
# need newer instructions die here with SIGILL exactly as on a Pi 4. Needs a Debian host
# (apt-get, dpkg-deb), qemu-user-static, mosquitto, network access to Debian and PyPI, and
# root once to enable the arm64 architecture in apt. Slow: see BENCHMARKS.md for timings.
# --coordinator checks an ARM home server instead: edgefl[coordinator] resolved for aarch64 (by
# uv, which evaluates its markers for aarch64: no NNI), REFT's pruning with torch-pruning and the
# ONNX export of every pruned level checked by onnxruntime, then a whole REFT job, all under qemu.
# --onnx DIR times the series models of DIR (bench/series_model_cost.py --save DIR) with onnxruntime
# under the arm64 Python (bench/series_onnx_cost.py): what serving them costs an emulated Pi 4 core.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
WORK=${EDGEFL_AARCH64_DIR:-/tmp/edgefl-aarch64}
CPU=cortex-a72
TORCH_SPEC="torch==2.9.1"  # PyPI's last aarch64 CPU-only wheel that runs on ARMv8.0
ROUNDS=2
HOST_PYTHON=${EDGEFL_PYTHON:-python3}
MODE=device

die() { echo "aarch64_check: error: $*" >&2; exit 1; }
say() { echo "[$(date +%H:%M:%S)] $*"; }

while [ $# -gt 0 ]; do
    case $1 in
        --cpu) CPU=${2:?}; shift ;;
        --torch) TORCH_SPEC=${2:?}; shift ;;
        --rounds) ROUNDS=${2:?}; shift ;;
        --work) WORK=${2:?}; shift ;;
        --coordinator) MODE=coordinator ;;
        --onnx) MODE=onnx; ONNX_DIR=$(cd "${2:?}" && pwd); shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) die "unknown option $1" ;;
    esac
    shift
done

QEMU=$(command -v qemu-aarch64-static) || die "apt install qemu-user-static"
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
[ "$MODE" != device ] || [ -x "$MOSQUITTO" ] || die "apt install mosquitto"
command -v dpkg-deb >/dev/null || die "needs a Debian host (dpkg-deb, apt-get)"
mkdir -p "$WORK"/{debs,wheels,run}
START=$(date +%s)

# A wheel of this checkout, built from a copy (the work tree stays clean).
build_wheel() {
    rm -rf "$WORK/edgefl-src" "$WORK/dist"
    mkdir -p "$WORK/edgefl-src"
    cp -r "$REPO_DIR"/{pyproject.toml,README.md,edge_sdk,coordinator,profiles} "$WORK/edgefl-src/"
    "$HOST_PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/edgefl-src"
}

# 1. An arm64 Python 3.11 root from Debian's packages (no binfmt, no chroot needed).
PY_DEBS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libexpat1 zlib1g libssl3
         libffi8 libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libuuid1 libgcc-s1
         libstdc++6 libgomp1 libcrypt1 libnsl2 libtirpc3 libdb5.3 libgssapi-krb5-2 libkrb5-3 libk5crypto3
         libcom-err2 libkrb5support0 libkeyutils1)
ROOT=$WORK/root
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        [ "$(id -u)" = 0 ] || die "run once as root to enable arm64 packages (dpkg --add-architecture arm64)"
        dpkg --add-architecture arm64
        apt-get update -qq
    fi
    say "downloading arm64 Python packages"
    (cd "$WORK/debs" && apt-get download -qq "${PY_DEBS[@]/%/:arm64}" 2>/dev/null)
    for deb in "$WORK"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
fi
# qemu-user shows the arm64 process this x86 host's /proc/cpuinfo unless the root has one (-L is
# searched first): onnxruntime >= 1.28 segfaults on import reading the x86 one. An ARM one, as a Pi's:
case $CPU in cortex-a53) PART=0xd03 ;; cortex-a76) PART=0xd0b ;; *) PART=0xd08 ;; esac
mkdir -p "$ROOT/proc"
for ((i = 0; i < $(nproc); i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\n' "$i"
    printf 'CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: %s\nCPU revision\t: 3\n\n' "$PART"
done > "$ROOT/proc/cpuinfo"
PY=("$QEMU" -cpu "$CPU" -L "$ROOT" "$ROOT/usr/bin/python3.11")
"${PY[@]}" -c 'import platform, ssl; assert platform.machine() == "aarch64"' \
    || die "the arm64 Python does not run under qemu"

# pip's options for PyPI's aarch64 wheels (CPython 3.11)
PLATFORM=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
          --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64
          --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)

# The series models' cost under the arm64 Python: onnxruntime and numpy from aarch64 wheels.
onnx_check() {
    local site=$WORK/onnx-site version
    version=$("$HOST_PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null || echo "")
    if [ ! -d "$site/onnxruntime" ]; then
        say "installing onnxruntime${version:+ $version} and numpy from aarch64 wheels"
        PIP_CONSTRAINT="" "$HOST_PYTHON" -m pip install -q "${PLATFORM[@]}" --target "$site" --no-deps \
            "onnxruntime${version:+==$version}" "numpy>=1.24" flatbuffers packaging protobuf sympy mpmath
    fi
    say "arm64 Python ($CPU): the series models of $ONNX_DIR"
    PYTHONPATH=$site "${PY[@]}" "$REPO_DIR/bench/series_onnx_cost.py" "$ONNX_DIR" --series "${ONNX_SERIES:-20}"
    say "the same here ($(uname -m), native)"
    "$HOST_PYTHON" "$REPO_DIR/bench/series_onnx_cost.py" "$ONNX_DIR" --series "${ONNX_SERIES:-20}"
}

# An ARM home server: the coordinator extra as `pip install edgefl[coordinator]` gets it on aarch64,
# then REFT's pruning, the ONNX export of each pruned level and a whole REFT job, under qemu.
coordinator_check() {
    local site=$WORK/coordinator-${TORCH_SPEC//[^A-Za-z0-9.]/_} uv run=$WORK/run/reft
    if [ ! -d "$site/torch_pruning" ]; then
        uv=$(command -v uv || true)
        if [ -z "$uv" ]; then
            [ -x "$WORK/uv/bin/uv" ] || { "$HOST_PYTHON" -m venv "$WORK/uv" && "$WORK/uv/bin/python" -m pip install -q uv; }
            uv=$WORK/uv/bin/uv
        fi
        build_wheel
        say "installing edgefl[coordinator] and $TORCH_SPEC for aarch64 (markers evaluated for aarch64)"
        "$uv" pip install -q --target "$site" --python-platform aarch64-manylinux_2_28 --python-version 3.11 \
            --no-build "$TORCH_SPEC" "edgefl[coordinator] @ file://$(ls "$WORK"/dist/edgefl-*.whl)"
    fi
    [ ! -d "$site/nni" ] || die "NNI was installed for aarch64: its marker is wrong"
    say "installed for aarch64: $(du -sm "$site" | cut -f1) MB, $(find "$site" -maxdepth 1 -name '*.dist-info' | wc -l) packages, no NNI"
    say "arm64 Python ($CPU): REFT's pruning levels and their ONNX export"
    PYTHONPATH=$site "${PY[@]}" - <<'EOF'
import importlib.util, os, platform, tempfile, time
t0 = time.time()
import numpy as np
import torch
from sklearn.datasets import load_digits
from coordinator.runtime.export import export_onnx
from coordinator.strategies.pruning import available_backends, prune_spec, resolve_backend
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import cnn4
from edge_sdk.tensors import load_numpy_state, state_to_numpy
print(f"{platform.machine()}, torch {torch.__version__}, NNI installed: {importlib.util.find_spec('nni') is not None}, "
      f"pruning backends: {available_backends()} (imports {time.time() - t0:.0f} s)")
assert platform.machine() == "aarch64" and resolve_backend("auto") == "torch-pruning"
images = load_digits().images[:, None].astype(np.float32)
x = (images[:64] - images.mean()) / images.std()
spec = cnn4(image_size=8)  # REFT's default model, for the 8x8 digits
torch.manual_seed(0)
weights = state_to_numpy(build_model(spec), copy=True)
with tempfile.TemporaryDirectory() as tmp:
    for level in (0.4, 0.8, 0.9):
        t = time.time()
        pruned = prune_spec(spec, weights, level)  # backend "auto", REFT's default
        t_prune, t = time.time() - t, time.time()
        model = build_model(pruned.spec)
        load_numpy_state(model, pruned.tensors)
        path = os.path.join(tmp, f"p{level}.onnx")
        diff = export_onnx(model, path, x)  # onnxruntime vs torch on 64 digits
        print(f"p{level}: {pruned.backend}, {pruned.params:,} of 130,890 params, {pruned.flops:,} FLOPs, pruned in "
              f"{t_prune:.1f} s; ONNX {os.path.getsize(path):,} bytes in {time.time() - t:.1f} s, onnxruntime vs "
              f"torch max |diff| {diff:.1e}")
        assert pruned.backend == "torch-pruning" and diff < 1e-4
EOF
    say "arm64 Python ($CPU): a REFT job (edgefl simulate, embedded broker, 4 devices, 1 round)"
    rm -rf "$run"
    PYTHONPATH=$site "${PY[@]}" -m edge_sdk.cli simulate --method reft --clients 4 --rounds 1 --dataset digits \
        --local-epochs 5 --option f_lambda=20 --seed 0 --out "$run" | tail -2
    "$HOST_PYTHON" - "$run/report.json" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
backend = report["config"]["method_config"]["pruning_backend"]
models = {k: v["params"] for k, v in report["models"].items() if k != "global"}
assert backend == "torch-pruning" and report["rounds"][0]["participants"], report["config"]["method_config"]
print(f"OK: REFT on aarch64 pruned with {backend} to {models} params and distilled the global model: "
      f"accuracy {report['final']['accuracy']['global']:.3f}; whole check {sys.argv[2]} s")
EOF
}
if [ "$MODE" = coordinator ]; then
    coordinator_check
    exit 0
fi
if [ "$MODE" = onnx ]; then
    onnx_check
    exit 0
fi

# 2. The edge SDK from aarch64 wheels: torch (CPU build, no CUDA), numpy, paho-mqtt, msgpack,
#    cryptography (with cffi and pycparser).
SITE=$WORK/site-${TORCH_SPEC//[^A-Za-z0-9.]/_}
if [ ! -d "$SITE/torch" ] || [ ! -d "$SITE/cryptography" ]; then
    say "installing $TORCH_SPEC and the SDK's dependencies from aarch64 wheels"
    build_wheel
    # torch's own requirements minus the CUDA ones (which PyPI's aarch64 torch >= 2.11 adds)
    PIP_CONSTRAINT="" "$HOST_PYTHON" -m pip install -q "${PLATFORM[@]}" --target "$SITE" --no-deps \
        "$TORCH_SPEC" "numpy>=1.24" "paho-mqtt>=2.1,<3" "msgpack>=1.0" "cryptography>=42" cffi pycparser \
        filelock "typing-extensions>=4.10" \
        "sympy>=1.13.3" networkx jinja2 markupsafe mpmath "fsspec>=0.8.5" "$WORK"/dist/edgefl-*.whl
fi
SIZE=$(du -sm "$SITE" | cut -f1)

# 3. Data: scikit-learn's real 8x8 digits; the device gets 600 of them as its private npz.
"$HOST_PYTHON" - "$WORK/run/data.npz" <<'EOF'
import sys
import numpy as np
from sklearn.datasets import load_digits
d = load_digits()
x, y = d.images[:, None].astype(np.float32), d.target.astype(np.int64)
np.savez(sys.argv[1], x_train=x[:600], y_train=y[:600], x_test=x[600:700], y_test=y[600:700])
EOF

# 4. A private mosquitto on loopback, an x86 coordinator, and the arm64 device.
PORT=$("$HOST_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RUN=$WORK/run
printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_packet_size 4194304\nuser root\n' "$PORT" > "$RUN/mosquitto.conf"
cat > "$RUN/coordinator.toml" <<EOF
method = "fedavg"
job = "aarch64"
model = "cnn4"
dataset = "digits"
out = "$RUN/report"
[broker]
url = "mqtt://127.0.0.1:$PORT"
[federation]
rounds = $ROUNDS
min_devices = 1
round_deadline_s = 3600
register_timeout_s = 3600
[train]
epochs = 1
batch_size = 32
lr = 0.05
EOF
cat > "$RUN/client.toml" <<EOF
device_id = "pi4-emulated"
job = "aarch64"
state_dir = "$RUN/state"
heartbeat_s = 60
[broker]
url = "mqtt://127.0.0.1:$PORT"
[device]
profile = "measure"
measure_seconds = 0.5
[data]
dataset = "npz:$RUN/data.npz"
[schedule]
threads = 2
EOF

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
"$MOSQUITTO" -c "$RUN/mosquitto.conf" > "$RUN/mosquitto.log" 2>&1 &
PIDS+=($!)
"$HOST_PYTHON" -m edge_sdk.cli -v coordinator --config "$RUN/coordinator.toml" > "$RUN/coordinator.log" 2>&1 &
COORD=$!
PIDS+=("$COORD")

say "arm64 Python ($CPU): importing the SDK"
T0=$(date +%s)
RC=0
PYTHONPATH=$SITE "${PY[@]}" -c 'import time; t = time.time(); import torch, edge_sdk.client
print(f"torch {torch.__version__} + edge_sdk.client imported in {time.time() - t:.1f} s")' || RC=$?
[ "$RC" = 132 ] && die "$TORCH_SPEC dies with SIGILL (Illegal instruction) on $CPU"
[ "$RC" = 0 ] || die "importing the SDK failed (exit $RC)"
T1=$(date +%s)
say "arm64 device joins the x86 coordinator for $ROUNDS round(s)"
PYTHONPATH=$SITE "${PY[@]}" -m edge_sdk.cli -v client --config "$RUN/client.toml" 2>&1 | tee "$RUN/device.log" | \
    grep -E "client finished|Error|error" || true
T2=$(date +%s)
wait "$COORD" || die "coordinator failed: $(tail -5 "$RUN/coordinator.log")"
"$HOST_PYTHON" - "$RUN/report/report.json" "$SIZE" "$((T1 - T0))" "$((T2 - T1))" "$(( $(date +%s) - START ))" "$CPU" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
rounds = report["rounds"]
dev = report["devices"][0]
assert rounds and all(r["participants"] for r in rounds), "no round completed with the arm64 device"
print(f"OK: {len(rounds)} round(s) with {dev['id']} (aarch64 under qemu, cpu {sys.argv[6]}); "
      f"accuracy per round: {[round(r['accuracy']['global'], 3) for r in rounds]}")
print(f"installed SDK + deps: {sys.argv[2]} MB; import under qemu: {sys.argv[3]} s; "
      f"device run: {sys.argv[4]} s; whole check: {sys.argv[5]} s")
EOF
