"""Serving on live readings, end to end (issue 59's targets): PLAID's test series, which no device
trained on, replayed time-compressed as MQTT readings (a JSON reading with its time, as zigbee2mqtt
sends ``last_seen``) at ``--rate`` readings a second into an ``edgefl serve`` process (onnxruntime,
one thread, no torch imported), through a real mosquitto.

It prints and writes (``--out``/result.json): the agreement of the live predictions with
`edgefl predict` (`OnnxClassifier`) on the same windows, their accuracy on the test labels, the
latency from a window's last reading leaving the bench to its prediction arriving back (p50, p99),
and the serving process's RSS (peak, and at the start and the end of the flood). With ``--train N``
it also times a device's training round (one local epoch of the served model's family on PLAID's
training series, one thread, in its own process) N times before the flood and N times during it:
the issue's "training round within 1.2x of its time without the flood".

    OMP_NUM_THREADS=1 python bench/serve_replay.py --model versions/<v>/global.onnx [--rate 2000] [--train 2] [--tls]

``--tls``: through the shipped home-server mosquitto (deploy/homeserver: TLS on 8883, the ACL, users
from add-device.sh): the readings published by the template's zigbee2mqtt user, the device's serving
user (``plug.serve``, add-device.sh ``--reads``) allowed to read exactly that topic, the predictions
read by Home Assistant's user.

``--model``: a published PLAID model (a kept version's ONNX: ``edgefl simulate --dataset plaid
--model cnn1d --checkpoint-dir DIR`` keeps them in DIR/versions/); its version is read from the
folder's version.json when there is one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support's home broker (--tls)

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from edge_sdk.data.datasets import load_dataset
from edge_sdk.inference import OnnxClassifier
from edge_sdk.model_store import save_model
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from edge_sdk.protocol.messages import Model
from edge_sdk.protocol.topics import Topics

TOPIC = "zigbee2mqtt/Bench plug"


def train_once(family: str, length: int) -> float:
    """Seconds of one local epoch of ``family`` on PLAID's training series (one thread): a device's round."""
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import MODEL_FAMILIES
    from edge_sdk.training import TrainConfig, train_local

    plaid = load_dataset("plaid")
    model = build_model(MODEL_FAMILIES[family](plaid.x_train.shape[1], plaid.num_classes, length))
    x = plaid.x_train[:, :, :length] if plaid.x_train.shape[2] >= length else plaid.x_train
    started = time.perf_counter()
    train_local(model, x.astype(np.float32), plaid.y_train, TrainConfig(epochs=1, threads=1))
    return time.perf_counter() - started


def timed_rounds(count: int, family: str, length: int) -> list[float]:
    """``count`` training rounds, each in a fresh process (as a device's round is in its own)."""
    seconds = []
    for _ in range(count):
        out = subprocess.run([sys.executable, __file__, "--train-once", family, "--model", "-", "--length",
                              str(length)], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        seconds.append(float(out.stdout.strip().splitlines()[-1]))
    return seconds


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def install(model: Path, state_dir: Path) -> tuple[int, tuple[int, ...]]:
    data = model.read_bytes()
    meta = model.parent / "version.json"
    version = json.loads(meta.read_text())["version"] if meta.exists() else 1
    shape = OnnxClassifier(model).preprocessing.input_shape  # type: ignore[union-attr]
    save_model(state_dir, Model("global", 0, hashlib.sha256(data).digest(), data, tuple(shape), version=version))
    return version, tuple(shape)


def broker_for(tls: bool, out: Path, stack: contextlib.ExitStack) -> tuple[Callable[[str], MqttTransport], str]:
    """A started broker: ``connect(who)`` for Home Assistant's side ("home") and the plug ("sender"),
    and the serving device's ``[broker]`` table. ``tls``: the shipped home-server set-up."""
    if not tls:
        broker = stack.enter_context(EmbeddedBroker(BrokerConfig(prefer="mosquitto")))

        def plain(who: str) -> MqttTransport:
            transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"bench-{who}"))
            transport.connect()
            return transport
        return plain, f'[broker]\nurl = "{broker.url}"\n'
    from tests.support.home_broker import start_home_broker

    folder = out / "home"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    home = start_home_broker(folder, devices=("plug",), homeassistant=True, reads={"plug": (TOPIC,)},
                             zigbee2mqtt="bench-zigbee2mqtt")
    stack.callback(home.stop)

    def secure(who: str) -> MqttTransport:
        if who == "home":
            return home.homeassistant(client_id="bench-ha")
        transport = MqttTransport(TransportConfig(url=home.url, client_id="bench-z2m", username="zigbee2mqtt",
                                                  password="bench-zigbee2mqtt", ca_file=str(home.ca)))
        transport.connect()
        return transport
    bundle = folder / "plug"  # the serving connection's own user, plug.serve (add-device.sh --reads)
    return secure, (f'[broker]\nurl = "{home.url}"\nusername = "plug.serve"\n'
                    f'password_file = "{bundle / "serve.password"}"\nca_file = "{bundle / "ca.crt"}"\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a published PLAID model (ONNX)")
    parser.add_argument("--rate", type=float, default=2000.0, help="readings a second")
    parser.add_argument("--series", type=int, default=0, help="replay only the first N test series (0: all)")
    parser.add_argument("--out", default="runs/serve_replay")
    parser.add_argument("--train", type=int, default=0, help="time N training rounds before and during the flood")
    parser.add_argument("--train-family", default="cnn1d", help="the model family the device trains")
    parser.add_argument("--tls", action="store_true", help="through the shipped TLS mosquitto, its ACL and users")
    parser.add_argument("--train-once", metavar="FAMILY", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_once:
        print(f"{train_once(args.train_once, args.length):.4f}")
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    state_dir = out / "device"
    state_dir.mkdir(exist_ok=True)
    for old in state_dir.glob("*.jsonl"):
        old.unlink()
    version, (channels, length) = install(Path(args.model), state_dir)
    plaid = load_dataset("plaid")
    mean, std = np.array(plaid.mean)[:, None], np.array(plaid.std)[:, None]
    series = plaid.x_test * std + mean  # raw readings (already resampled to the model's length)
    labels = plaid.y_test
    if args.series:
        series, labels = series[:args.series], labels[:args.series]
    assert series.shape[1:] == (channels, length), (series.shape, channels, length)
    series = np.round(series, 4)  # as a meter sends them; `edgefl predict` sees the very same values
    expected = OnnxClassifier(state_dir / "model.onnx").predict(series.astype(np.float32)).classes
    topics = Topics(job="bench")
    result: dict = {"model": str(args.model), "version": version, "series": len(series), "length": length,
                    "rate": args.rate,
                    "broker": "the shipped TLS mosquitto, ACL and users" if args.tls else "mosquitto"}
    if args.train:
        result["train_alone_s"] = timed_rounds(args.train, args.train_family, length)
    during: list[float] = []
    with contextlib.ExitStack() as stack:
        serve_log = stack.enter_context(open(out / "serve.log", "w"))
        connect, broker_toml = broker_for(args.tls, out, stack)
        toml = out / "client.toml"
        toml.write_text(f'device_id = "plug"\njob = "bench"\nstate_dir = "{state_dir}"\n{broker_toml}'
                        f'[serve]\ninputs = [{{ topic = "{TOPIC}", field = "w", time_field = "t" }}]\n'
                        f'length = {length}\nmax_gap_s = 5\nmax_per_s = 100000\n')
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        serve = subprocess.Popen([sys.executable, "-m", "edge_sdk.cli", "serve", "--config", str(toml)],
                                 stdout=serve_log, stderr=subprocess.STDOUT, env=env)
        home = connect("home")
        home.subscribe(topics.prediction("plug"))
        received: list[tuple[float, dict]] = []

        def listen() -> None:
            while serve.poll() is None or not done.is_set():
                message = home.receive(timeout=0.2)
                if message is not None and message.topic == topics.prediction("plug") and not message.retained:
                    received.append((time.perf_counter(), json.loads(message.payload)))
                if done.is_set() and len(received) >= len(series):
                    return
        done = threading.Event()
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        sender = connect("sender")
        # warm up: until the server answers (started, subscribed, model loaded)
        clock, warm = 1_000_000.0, 0
        while not received and warm < 200:
            for value in series[0, 0]:
                clock += 0.001
                sender.publish(TOPIC, json.dumps({"w": float(value), "t": clock}).encode(), qos=0)
            clock += 10.0  # a gap: the next series is a new window
            warm += 1
            time.sleep(0.5)
        time.sleep(1.0)
        received.clear()
        rss_start = rss_mb(serve.pid)
        peak = rss_start
        sent_at: list[float] = []
        gap = 1.0 / args.rate
        trainer = threading.Thread(target=lambda: during.extend(timed_rounds(args.train, args.train_family, length)),
                                   daemon=True)
        if args.train:
            trainer.start()
        started = time.perf_counter()
        n = 0
        for row in series:
            for value in row[0]:
                clock += 0.001
                n += 1
                due = started + n * gap
                if (wait := due - time.perf_counter()) > 0:
                    time.sleep(wait)
                sender.publish(TOPIC, json.dumps({"w": float(value), "t": round(clock, 3)}).encode(), qos=0)
            sent_at.append(time.perf_counter())
            clock += 10.0
            if len(sent_at) % 20 == 0:
                peak = max(peak, rss_mb(serve.pid))
        flood_s = time.perf_counter() - started
        if args.train:
            trainer.join()
            result["train_during_s"] = during
            result["train_ratio"] = round(float(np.median(during) / np.median(result["train_alone_s"])), 3)
            result["train_ended_within_flood"] = bool(time.perf_counter() - started <= flood_s + 0.5)
        end = time.monotonic() + 30
        while len(received) < len(series) and time.monotonic() < end:
            time.sleep(0.1)
        done.set()
        rss_end = rss_mb(serve.pid)
        peak = max(peak, rss_end)
        serve.terminate()
        serve.wait(20)
        sender.close()
        home.close()
    live = [p for _, p in received]
    got = len(live)
    agree = sum(p["index"] == int(e) for p, e in zip(live, expected, strict=False))
    latencies = np.array([(at - sent) * 1000 for (at, _), sent in zip(received, sent_at, strict=False)])
    result.update(predictions=got, agreement=agree / max(got, 1), readings_per_s=round(n / flood_s, 1),
                  accuracy_live=float(np.mean([p["index"] == int(y) for p, y in zip(live, labels, strict=False)]))
                  if got else None,
                  accuracy_predict=float((expected == labels).mean()),
                  latency_ms={"p50": round(float(np.percentile(latencies, 50)), 2),
                              "p99": round(float(np.percentile(latencies, 99)), 2),
                              "max": round(float(latencies.max()), 2)} if got else None,
                  rss_mb={"start": round(rss_start, 1), "end": round(rss_end, 1), "peak": round(peak, 1)},
                  versions_named=sorted({p["version"] for p in live}))
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    lat = result["latency_ms"] or {}
    print(f"{got} of {len(series)} windows predicted live, agreement with edgefl predict "
          f"{100 * result['agreement']:.1f} %, accuracy {result['accuracy_live']:.3f}; "
          f"latency p50 {lat.get('p50')} ms, p99 {lat.get('p99')} ms at {result['readings_per_s']:.0f} readings/s; "
          f"serving RSS {peak:.0f} MB; "
          + (f"training round {np.median(during):.2f} s during the flood vs {np.median(result['train_alone_s']):.2f} s "
             f"alone ({result['train_ratio']:.2f}x); " if args.train else "")
          + f"model {args.model} (version {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
