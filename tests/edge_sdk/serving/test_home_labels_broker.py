"""The home labels the windows a device serves, over a real broker: a scripted zigbee2mqtt plug's
on/off (its state in the same message as its power) labels exactly the windows within each state, a
window that straddles the switch is dropped, a correction chosen in Home Assistant's select (as HA
publishes it) labels that window — and the next round trains on them: the device's training count at
the coordinator is the store's training rows, the correction among them."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import numpy as np

from coordinator.core.federation import FederationConfig
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.report import RunReport
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.task import Task
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.device_config import client_from_toml
from edge_sdk.networking.link import MessageLink
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from edge_sdk.protocol.topics import Topics
from edge_sdk.data.label_store import CORRECTION, EVENT, STORE_FILENAME, LabelStore, window_key
from edge_sdk.serving.serve_command import server_from_toml
from edge_sdk.training import TrainConfig
from tests.support.serving import CLASSES, LENGTH, Home, install_model

JOB, PLUG = "home", "zigbee2mqtt/Kettle plug"


def client_toml(tmp_path, url: str) -> str:
    return f"""
device_id = "plug"
job = "{JOB}"
state_dir = "{tmp_path}"
[broker]
url = "{url}"
[device]
profile = "raspberry-pi-4b"
[data]
holdout = 0.2
[serve]
inputs = [{{ topic = "{PLUG}", field = "power" }}]
max_per_s = 100000
[labels]
topic = "{PLUG}"
field = "state"
map = {{ ON = "kettle", OFF = "idle" }}
"""


def test_a_plugs_on_and_off_and_a_correction_label_windows_the_next_round_trains_on(tmp_path, broker) -> None:
    install_model(tmp_path)
    toml = tmp_path / "client.toml"
    toml.write_text(client_toml(tmp_path, broker.url))
    server = server_from_toml(toml)
    assert server is not None
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop,), daemon=True)
    thread.start()
    topics = Topics(job=JOB)
    home = Home(broker.url, topics.prediction("plug"))
    # six windows of 24 readings: OFF, OFF, a switch ON halfway, ON, ON, OFF from its first reading
    states = ["OFF"] * 2 * LENGTH + ["OFF"] * (LENGTH // 2) + ["ON"] * (LENGTH // 2 + 2 * LENGTH) + ["OFF"] * LENGTH
    power = [(2.0 if s == "OFF" else 2000.0) + 0.01 * i for i, s in enumerate(states)]  # no two alike: no repeats
    try:
        server.start()
        for peer in (server.transport, home.transport):  # both subscriptions in place
            peer.publish("test/sync", b"", qos=1)
            assert peer.wait_published(10.0)
        for state, watts in zip(states, power, strict=True):
            home.transport.publish(PLUG, json.dumps({"state": state, "power": round(watts, 2)}).encode(), qos=1)
        home.read(lambda: len(home.predictions) == 6)
        straddled_end = home.predictions[2]["end"]
        # Home Assistant's select: the bare option through the command template, QoS 0, not retained
        correction = json.dumps({"class": "kettle", "end": straddled_end}).encode()
        home.transport.publish(topics.correction("plug"), correction, qos=0)
        end = time.monotonic() + 10
        while server.corrections.taken == 0 and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=5)
        home.transport.close()
    assert len(home.predictions) == 6, server.counts
    counts = server.labels.counts
    assert (counts.changes, counts.labelled, counts.straddled) == (3, 5, 1), counts
    rows = LabelStore.read(tmp_path / STORE_FILENAME)
    first = rows.values[:, 0, 0].astype(np.float64)  # each window's first reading: 2 or 2000 W + 0.01 W x its index
    index = np.round((first - np.where(first < 1000, 2.0, 2000.0)) / 0.01).astype(int) // LENGTH
    stored = dict(zip(index.tolist(), zip(rows.labels, rows.origins, strict=True), strict=True))
    expected = {0: ("idle", EVENT), 1: ("idle", EVENT), 2: ("kettle", CORRECTION), 3: ("kettle", EVENT),
                4: ("kettle", EVENT), 5: ("idle", EVENT)}  # the third window straddles the switch: only corrected
    assert stored == expected and len(rows) == 6
    row = list(index).index(2)
    corrected_key = int(rows.keys[row])
    assert corrected_key == window_key(datetime.fromisoformat(straddled_end).timestamp(), rows.values[row])

    # the next round: the device's training count at the coordinator is its store's training rows
    client = client_from_toml(toml)
    federation = FederationConfig(rounds=1, min_devices=1, round_deadline_s=60, seed=0,
                                  train=TrainConfig(epochs=1, lr=0.05, batch_size=4, threads=1))
    strategy = FedAvg.create(StrategyContext(federation, "cnn1d", (1, LENGTH), len(CLASSES)))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{JOB}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), topics, task=Task((1, LENGTH), len(CLASSES)))
    fleet.start()
    device = threading.Thread(target=client.run, daemon=True)
    device.start()
    try:
        report = RoundLoop(strategy, fleet, RunReport("fedavg", {}),
                           preprocessing=Preprocessing((1000.0,), (1000.0,), CLASSES, (1, LENGTH))).run()
    finally:
        device.join(timeout=20)
        transport.close()
    assert report.rounds[0].participants == ["plug"]
    trained = client.data
    assert np.uint64(corrected_key) in trained.keys  # a correction is never held out
    held = len(client.holdout) if client.holdout is not None else client.local.waiting
    assert len(trained) + held == 6 and fleet.devices["plug"].num_samples == len(trained) >= 1
