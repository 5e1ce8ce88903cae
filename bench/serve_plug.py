"""A plug's low-rate power readings served at their real rate through windows by time (issue 59):
ItalyPowerDemand's test series (24 readings a day, one an hour), replayed one reading every
``--period`` seconds as a zigbee2mqtt plug sends them (JSON, ``last_seen`` in epoch milliseconds, the
plug's own clock),
into ``edgefl serve`` with ``period_s`` = that period (a point a period, the last value held) through
mosquitto. The served model: a cnn1d trained here on the training split for ``--epochs`` epochs and
exported as the coordinator exports it (normalisation in the graph).

Its last line: the windows predicted, their agreement with `edgefl predict` (`OnnxClassifier`) on the
same 24 readings, their accuracy, the latency from a window's last reading to its prediction, and
the wall time (a window takes 24 periods: 48 s at the default 2 s).

    OMP_NUM_THREADS=1 python bench/serve_plug.py [--series 5] [--period 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker  # noqa: E402
from edge_sdk.inference import OnnxClassifier  # noqa: E402
from edge_sdk.model_store import save_model  # noqa: E402
from edge_sdk.networking.transport import MqttTransport, TransportConfig  # noqa: E402
from edge_sdk.protocol.messages import Model  # noqa: E402
from edge_sdk.protocol.topics import Topics  # noqa: E402

TOPIC, CLASSES, LENGTH = "zigbee2mqtt/Office plug", ("1", "2"), 24


def italy_power_demand() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sktime.datasets import load_italy_power_demand

    x_train, y_train = load_italy_power_demand(split="train", return_type="numpy3D")
    x_test, y_test = load_italy_power_demand(split="test", return_type="numpy3D")
    return (x_train.astype(np.float32), np.array([CLASSES.index(str(v)) for v in y_train]),
            x_test.astype(np.float32), np.array([CLASSES.index(str(v)) for v in y_test]))


def install_trained_model(state_dir: Path, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """A cnn1d fitted on the training split, exported with its normalisation, installed; the test split."""
    import torch

    from coordinator.runtime.export import export_onnx
    from edge_sdk.data.preprocessing import Preprocessing
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import cnn1d
    from edge_sdk.training import TrainConfig, train_local

    x_train, y_train, x_test, y_test = italy_power_demand()
    mean, std = float(x_train.mean()), float(x_train.std())
    torch.manual_seed(0)
    model = build_model(cnn1d(1, len(CLASSES), LENGTH, width=0.5))
    train_local(model, (x_train - mean) / std, y_train, TrainConfig(epochs=epochs, threads=1))
    path = state_dir / "export.onnx"
    export_onnx(model, path, x_train[:4], preprocessing=Preprocessing((mean,), (std,), CLASSES, (1, LENGTH)))
    data = path.read_bytes()
    save_model(state_dir, Model("global", epochs, hashlib.sha256(data).digest(), data, (1, LENGTH), version=1))
    return x_test, y_test


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=5, help="test series replayed (a window each)")
    parser.add_argument("--period", type=float, default=2.0, help="seconds between a plug's readings")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", default="runs/serve_plug")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    state_dir = out / "device"
    state_dir.mkdir(parents=True, exist_ok=True)
    for old in state_dir.glob("*.jsonl"):
        old.unlink()
    x_test, y_test = install_trained_model(state_dir, args.epochs)
    series, labels = np.round(x_test[:args.series, 0], 3), y_test[:args.series]
    expected = OnnxClassifier(state_dir / "model.onnx").predict(series[:, None, :].astype(np.float32))
    topics = Topics(job="bench")
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto")) as broker, open(out / "serve.log", "w") as serve_log:
        toml = out / "client.toml"
        toml.write_text(f'device_id = "plug"\njob = "bench"\nstate_dir = "{state_dir}"\n'
                        f'[broker]\nurl = "{broker.url}"\n'
                        f'[serve]\ninputs = [{{ topic = "{TOPIC}", field = "power", time_field = "last_seen" }}]\n'
                        f'period_s = {args.period}\nmax_gap_s = {3 * args.period}\n')
        serve = subprocess.Popen([sys.executable, "-m", "edge_sdk.cli", "serve", "--config", str(toml)],
                                 stdout=serve_log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        home = MqttTransport(TransportConfig(url=broker.url, client_id="bench-home"))
        home.connect()
        home.subscribe(topics.prediction("plug"))
        received: list[tuple[float, dict]] = []
        done = threading.Event()

        def listen() -> None:
            while not done.is_set():
                message = home.receive(timeout=0.2)
                if message is not None and not message.retained:
                    received.append((time.time(), json.loads(message.payload)))
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        plug = MqttTransport(TransportConfig(url=broker.url, client_id="bench-plug"))
        plug.connect()
        time.sleep(3.0)  # the server started and subscribed (it reads no retained readings)
        started = time.time()
        last_sent: list[float] = []
        tick = 0
        for row in series:  # one day after the other: each window's points are that day's 24 readings
            for value in row:  # stamped by the plug's own clock, a reading every period
                due = started + tick * args.period
                time.sleep(max(0.0, due - time.time()))
                plug.publish(TOPIC, json.dumps({"power": float(value), "state": "ON", "linkquality": 120 + tick % 2,
                                                "last_seen": int(round(due * 1000))}).encode(), qos=0)
                tick += 1
            last_sent.append(time.time())
        # the last window's last point is its 24th tick: it is cut when the next reading comes after it
        time.sleep(max(0.0, started + tick * args.period - time.time()))
        plug.publish(TOPIC, json.dumps({"power": float(series[-1, -1]), "state": "ON", "linkquality": 0,
                                        "last_seen": int(round((started + tick * args.period) * 1000))}).encode(),
                     qos=0)
        end = time.monotonic() + 10 + 2 * args.period
        while len(received) < len(series) and time.monotonic() < end:
            time.sleep(0.1)
        done.set()
        serve.terminate()
        serve.wait(20)
        plug.close()
        home.close()
    live = [p for _, p in received]
    agree = sum(p["index"] == int(e) for p, e in zip(live, expected.classes, strict=False))
    latency = [1000 * (at - sent) for (at, _), sent in zip(received, last_sent, strict=False)]
    result = {"series": len(series), "period_s": args.period, "predictions": len(live),
              "agreement": agree / max(len(live), 1),
              "accuracy_live": float(np.mean([p["index"] == int(y) for p, y in zip(live, labels, strict=False)]))
              if live else None, "accuracy_predict": float((expected.classes == labels).mean()),
              "latency_ms_median": round(float(np.median(latency)), 1) if latency else None,
              "wall_s": round(time.time() - started, 1)}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"{len(live)} of {len(series)} windows by time ({args.period:g} s a reading, its real rate) predicted live, "
          f"agreement with edgefl predict {100 * result['agreement']:.0f} %, accuracy {result['accuracy_live']}; "
          f"latency median {result['latency_ms_median']} ms after a window's last tick; {result['wall_s']} s; "
          f"model: a cnn1d trained here on ItalyPowerDemand ({args.epochs} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
