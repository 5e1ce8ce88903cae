"""A home fleet that learns all the time (issue 58's target), end to end with real processes: a
mosquitto broker, three `edgefl client` devices whose SQLite logs grow one row a second (the
ItalyPowerDemand training series, non-IID: each device sees mostly one class), and `edgefl
coordinator` paced by new data (`min_new_samples`), normalised by the fleet's statistics, stopped
with SIGTERM halfway (as `systemctl stop` does) and started again.

It checks and prints: rounds started only when new rows arrived; both coordinator runs exited 0;
versions, published version and byte counters went on across the restart; every federated figure
carries its sample count and interval; a replay of every device's log by key finds no held-out
sample on the training side at any prefix of the log, and every devices.csv count matches a prefix
of it; the published model (its kept ONNX file) on the 1,029 test series nobody trained on.

    OMP_NUM_THREADS=1 python bench/continuous_home.py [--every 1.0] [--out runs/continuous_home]

Needs mosquitto and sktime (ItalyPowerDemand ships with it). Results: <out>/result.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from coordinator.runtime.kept_versions import kept_versions
from edge_sdk.data.holdout import MIN_HOLDOUT, held_out

DEVICES = ("kitchen", "hall", "garage")
HOLDOUT = 0.25
CLASSES = ("1", "2")


def italy_power_demand() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sktime.datasets import load_italy_power_demand

    x_train, y_train = load_italy_power_demand(split="train", return_type="numpy3D")
    x_test, y_test = load_italy_power_demand(split="test", return_type="numpy3D")
    return (x_train.astype(np.float32), np.array([CLASSES.index(str(v)) for v in y_train]),
            x_test.astype(np.float32), np.array([CLASSES.index(str(v)) for v in y_test]))


def non_iid_parts(y: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Device i gets 80 % of its rows from one class (kitchen, garage: class 1; hall: class 2)."""
    rng = np.random.default_rng(seed)
    by_class = [list(rng.permutation(np.flatnonzero(y == c))) for c in (0, 1)]
    parts: dict[str, list[int]] = {d: [] for d in DEVICES}
    mostly = {"kitchen": 0, "hall": 1, "garage": 0}
    while any(by_class):
        for device in DEVICES:
            c = mostly[device] if rng.random() < 0.8 else 1 - mostly[device]
            pool = by_class[c] or by_class[1 - c]
            if pool:
                parts[device].append(pool.pop())
    return {d: np.array(rows) for d, rows in parts.items()}


def create_log(path: Path) -> None:
    with sqlite3.connect(path) as db:
        cols = ", ".join(f"f{i} REAL" for i in range(24))
        db.execute(f"CREATE TABLE readings (ts INTEGER PRIMARY KEY, {cols}, label TEXT)")


def append_row(path: Path, ts: int, series: np.ndarray, label: int) -> None:
    with sqlite3.connect(path) as db:
        marks = ", ".join("?" * 26)
        db.execute(f"INSERT INTO readings VALUES ({marks})", (ts, *map(float, series.ravel()), CLASSES[label]))


def client_toml(folder: Path, url: str, device: str) -> Path:
    path = folder / f"{device}.toml"
    features = ", ".join(f"f{i}" for i in range(24))
    path.write_text(f"""device_id = "{device}"
job = "home"
state_dir = "{folder / device}"
heartbeat_s = 2
[broker]
url = "{url}"
[device]
profile = "raspberry-pi-4b"
[data]
sqlite = "{folder / device}.db"
query = "SELECT ts, {features}, label FROM readings"
key = "ts"
input_shape = [1, 24]
classes = {json.dumps(list(CLASSES))}
holdout = {HOLDOUT}
reread_s = 1
""")
    return path


def coordinator_toml(folder: Path, url: str) -> Path:
    path = folder / "coordinator.toml"
    path.write_text(f"""method = "fedavg"
job = "home"
model = "cnn1d"
out = "{folder / 'out'}"
[broker]
url = "{url}"
[task]
input_shape = [1, 24]
classes = {json.dumps(list(CLASSES))}
mean = "fleet"
std = "fleet"
[federation]
min_devices = 3
min_new_samples = 6
new_samples_share = 0.5
round_deadline_s = 60
register_timeout_s = 120
checkpoint_dir = "{folder / 'checkpoint'}"
keep_versions = 3
min_eval_samples = 5
[train]
epochs = 5
batch_size = 8
lr = 0.05
""")
    return path


def edgefl(*args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "edge_sdk.cli", args[0], "-v", *args[1:]], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, env=env)


def stop(process: subprocess.Popen, timeout: float = 60.0) -> tuple[int, float]:
    """SIGTERM, as systemctl stop sends it; (exit status, seconds to exit)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout), time.monotonic() - started


def replay(db: Path, counts: list[dict[str, str]], device: str) -> dict[str, int]:
    """Every prefix of the device's log split by key: no key on both sides at any two prefixes, and
    each devices.csv count of this device is some prefix's (training count; held-out count, or 0
    while fewer than MIN_HOLDOUT wait)."""
    with sqlite3.connect(db) as conn:
        keys = np.array([k for (k,) in conn.execute("SELECT ts FROM readings ORDER BY rowid")], dtype=np.int64)
    held = held_out(keys.view(np.uint64), HOLDOUT)
    assert not (set(keys[held]) & set(keys[~held])), "a key on both sides"
    trained_at = np.cumsum(~held)
    held_at = np.cumsum(held)
    prefixes = {(int(t), int(h) if h >= MIN_HOLDOUT else 0) for t, h in zip(trained_at, held_at, strict=True)}
    trained_ok = evaluated_ok = rows = 0
    for row in (r for r in counts if r["device"] == device):
        rows += 1
        if row["trained"]:
            assert any(t == int(row["trained"]) for t, _ in prefixes), f"{device}: trained {row['trained']}"
            trained_ok += 1
        if row["held_out"]:
            assert any(h == int(row["held_out"]) for _, h in prefixes), f"{device}: held out {row['held_out']}"
            evaluated_ok += 1
    return {"rows_in_log": len(keys), "held_out_keys": int(held.sum()), "devices_csv_rows": rows,
            "trained_counts_matched": trained_ok, "held_out_counts_matched": evaluated_ok}


def published_accuracy(checkpoint: Path, x_test: np.ndarray, y_test: np.ndarray) -> tuple[int, float]:
    """The newest kept version's ONNX model on the test series (raw: the model normalises)."""
    import onnxruntime

    kept = kept_versions(checkpoint)[-1]
    session = onnxruntime.InferenceSession(str(kept.path / f"{kept.labels[0]}.onnx"))
    logits = session.run(None, {session.get_inputs()[0].name: x_test})[0]
    return kept.version, float((logits.argmax(1) == y_test).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=1.0, help="seconds between a device's rows")
    parser.add_argument("--out", default="runs/continuous_home")
    args = parser.parse_args()
    folder = Path(args.out).resolve()
    if folder.exists():
        import shutil
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    x_train, y_train, x_test, y_test = italy_power_demand()
    parts = non_iid_parts(y_train)
    for device in DEVICES:
        create_log(folder / f"{device}.db")
    result: dict = {"rows_per_device": {d: len(p) for d, p in parts.items()}, "every_s": args.every}
    with EmbeddedBroker(BrokerConfig()) as broker:
        result["broker"] = broker.kind
        seeded = {d: 3 for d in DEVICES}  # a few rows before the devices start: they register with data
        for device, rows in parts.items():
            for i in rows[:seeded[device]]:
                append_row(folder / f"{device}.db", int(i) + 1, x_train[i], int(y_train[i]))
        clients = [edgefl("client", "--config", str(client_toml(folder, broker.url, d)), log=folder / f"{d}.log")
                   for d in DEVICES]
        config = coordinator_toml(folder, broker.url)
        coordinator = edgefl("coordinator", "--config", str(config), log=folder / "coordinator.log")
        started = time.monotonic()
        written = dict(seeded)

        def writer() -> None:  # one row a second per device, until each log holds its part
            while any(written[d] < len(parts[d]) for d in DEVICES):
                time.sleep(args.every)
                for device in DEVICES:
                    if written[device] < len(parts[device]):
                        i = parts[device][written[device]]
                        append_row(folder / f"{device}.db", int(i) + 1, x_train[i], int(y_train[i]))
                        written[device] += 1

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        history = folder / "checkpoint" / "history.jsonl"
        while time.monotonic() - started < 180 and (not history.exists() or len(history.read_text().splitlines()) < 2):
            time.sleep(0.5)  # two versions, then a stop in the middle of whatever comes next
        time.sleep(1.5)
        status, seconds = stop(coordinator)
        result["first_run"] = {"exit": status, "stop_seconds": round(seconds, 2), "rows_written": dict(written),
                               "report": json.loads((folder / "out" / "report.json").read_text())["final"]}
        time.sleep(3.0)  # rows keep arriving while no coordinator runs
        coordinator = edgefl("coordinator", "--config", str(config), log=folder / "coordinator.log")
        thread.join()
        time.sleep(25.0)  # the last rows trained on, then idle: waiting_for_data
        status, seconds = stop(coordinator)
        result["second_run"] = {"exit": status, "stop_seconds": round(seconds, 2)}
        result["wall_s"] = round(time.monotonic() - started, 1)
        for client in clients:
            stop(client)
    report = json.loads((folder / "out" / "report.json").read_text())
    history = [json.loads(line) for line in open(folder / "checkpoint" / "history.jsonl")]
    final = report["final"]
    result["second_run"]["report"] = final
    result["rounds"] = len(history)
    result["versions"] = [r["version"] for r in history]
    result["published_versions"] = [r["published_version"] for r in history]
    result["participants_per_round"] = [len(r["participants"]) for r in history]
    figures = [r["evaluation"].get("by_label", {}) for r in history if r.get("federated_accuracy")]
    result["figures_with_weight"] = sum(all({"samples", "devices", "low", "high"} <= set(f) for f in fig.values())
                                        for fig in figures)
    result["figures"] = len(figures)
    result["compared_on_same_samples"] = sum(1 for r in history if r["evaluation"].get("against_published"))
    counts = list(csv.DictReader(open(folder / "out" / "devices.csv")))
    result["replay"] = {d: replay(folder / f"{d}.db", counts, d) for d in DEVICES}
    version, accuracy = published_accuracy(folder / "checkpoint", x_test, y_test)
    result["published_model"] = {"version": version, "test_series": len(y_test), "accuracy": round(accuracy, 4)}
    result["health"] = report.get("health")
    (folder / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("first_run", "second_run")}, indent=1))
    print("first run:", result["first_run"]["exit"], result["first_run"]["stop_seconds"], "s;",
          "second run:", result["second_run"]["exit"], result["second_run"]["stop_seconds"], "s")
    assert result["first_run"]["exit"] == 0 and result["second_run"]["exit"] == 0
    assert result["versions"] == sorted(result["versions"]) and result["figures_with_weight"] == result["figures"]
    assert final["bytes_down_total"] > result["first_run"]["report"]["bytes_down_total"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
