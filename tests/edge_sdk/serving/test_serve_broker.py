"""A device serves its installed model on live MQTT readings, over a real broker: the prediction
(retained, with the model version and the window's span) is the one `edgefl predict` gives on the
same window, floods are rate-limited, a bad reading starts a new window — and `edgefl serve` runs
with torch absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from edge_sdk.inference import OnnxClassifier
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from edge_sdk.protocol.topics import Topics
from edge_sdk.serving import ServeConfig, ServeInput, Server
from edge_sdk.data.label_store import CORRECTION, STORE_FILENAME, LabelStore
from tests.support.serving import CLASSES, LENGTH, Home, install_model


def test_live_readings_give_the_prediction_edgefl_predict_gives(tmp_path, broker) -> None:
    install_model(tmp_path)
    topics = Topics(job="home")
    # windows 24 readings apart: none rate-limited
    config = ServeConfig((ServeInput("zigbee2mqtt/Kitchen plug", "power"),), max_per_s=100_000.0)
    transport = MqttTransport(TransportConfig(url=broker.url, client_id="plug-serve"))
    transport.connect()
    server = Server(config, transport, topics, "plug", tmp_path)
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop,), daemon=True)
    thread.start()
    home = Home(broker.url, topics.prediction("plug"))
    rng = np.random.default_rng(1)
    series = rng.normal(100.0, 50.0, size=(3, LENGTH)).round(1)
    try:
        server.start()  # subscribed once a later QoS 1 publish is acknowledged (the broker keeps their order)
        for peer in (transport, home.transport):  # both subscriptions in place
            peer.publish("test/sync", b"", qos=1)
            assert peer.wait_published(10.0)
        for row in series:
            for watts in row:
                payload = {"power": float(watts), "state": "ON", "linkquality": 90}
                home.transport.publish("zigbee2mqtt/Kitchen plug", json.dumps(payload).encode(), qos=0)
                home.transport.publish("zigbee2mqtt/Kitchen plug", json.dumps({**payload, "linkquality": 91}).encode(),
                                       qos=0)  # the same state re-sent on another field's change: a repeat
        home.read(lambda: len(home.predictions) == 3)
        home.transport.publish("zigbee2mqtt/Kitchen plug", b'{"power": "unavailable"}', qos=0)
        # a person corrects the first prediction, as Home Assistant's select publishes it (QoS 0, not retained)
        first_end = home.predictions[0]["end"]
        home.transport.subscribe(topics.correction_state("plug"))
        home.transport.publish(topics.correction("plug"), json.dumps({"class": "kettle", "end": first_end}).encode(),
                               qos=0)
        home.transport.publish(topics.correction("plug"), b'{"class": "oven", "end": null}', qos=0)  # not a class
        time.sleep(1.0)
        resets = []
        while (message := home.transport.receive(timeout=0.2)) is not None:
            resets.append(message.payload) if message.topic == topics.correction_state("plug") else None
    finally:
        stop.set()
        thread.join(timeout=5)
        transport.close()
        home.transport.close()
    expected = OnnxClassifier(tmp_path / "model.onnx").predict(series[:, None, :].astype(np.float32))
    assert [p["class"] for p in home.predictions] == [CLASSES[k] for k in expected.classes], \
        (server.builder.counts, server.counts)
    np.testing.assert_allclose([p["probability"] for p in home.predictions],
                               expected.probabilities.max(axis=1), atol=1e-5)
    first = home.predictions[0]
    assert first["version"] == 7 and first["model"] == "global" and len(first["top"]) == 2
    assert first["start"] <= first["end"]  # arrival times: 24 readings may come within one millisecond
    counts = server.builder.counts
    assert (counts.readings, counts.repeats, counts.windows, counts.bad) == (3 * LENGTH, 3 * LENGTH, 3, 1)
    logged = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert logged == home.predictions
    stored = LabelStore.read(tmp_path / STORE_FILENAME)  # the correction is a training row of the device's store
    assert stored.labels == ("kettle",) and stored.origins == (CORRECTION,) and stored.classes == CLASSES
    np.testing.assert_allclose(stored.values[0], series[:1], rtol=1e-6)  # the corrected window's readings
    assert server.corrections.refused == 1 and b"None" in resets  # the select can be used again


def test_a_flood_is_rate_limited(tmp_path, broker) -> None:
    install_model(tmp_path)
    config = ServeConfig((ServeInput("esphome/kitchen/sensor/power/state"),), max_per_s=2.0)
    transport = MqttTransport(TransportConfig(url=broker.url, client_id="flood-serve"))
    transport.connect()
    server = Server(config, transport, Topics(job="home"), "flood", tmp_path)
    from edge_sdk.networking.transport import IncomingMessage

    started = time.monotonic()
    for i in range(LENGTH * 50):  # 50 windows as fast as they come: at most 2 a second are predicted
        server.handle(IncomingMessage("esphome/kitchen/sensor/power/state", str(100 + i % 7).encode(), False))
    seconds = time.monotonic() - started
    transport.close()
    assert server.counts["predictions"] <= 2 + 2 * seconds + 1
    assert server.counts["predictions"] + server.counts["rate_limited"] == 50


def test_edgefl_serve_runs_without_torch(tmp_path, broker) -> None:
    install_model(tmp_path)
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # import torch fails\n")
    toml = tmp_path / "client.toml"
    toml.write_text(f'device_id = "pi"\njob = "home"\nstate_dir = "{tmp_path}"\n[broker]\nurl = "{broker.url}"\n'
                    f'[serve]\ninputs = [{{ topic = "home/power" }}]\nmax_per_s = 100\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    serve = subprocess.Popen([sys.executable, "-m", "edge_sdk.cli", "serve", "--config", str(toml)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    home = Home(broker.url, Topics(job="home").prediction("pi"))
    try:
        end = time.monotonic() + 60
        while not home.predictions and time.monotonic() < end:  # until it has started and subscribed
            for watts in np.linspace(50, 150, LENGTH):
                home.transport.publish("home/power", f"{watts:.1f}".encode(), qos=0)
            home.read(lambda: home.predictions, timeout=1.0)
    finally:
        serve.terminate()
        out, err = serve.communicate(timeout=20)
        home.transport.close()
    assert serve.returncode == 0, err[-2000:]
    assert home.predictions and home.predictions[0]["class"] in CLASSES, err[-2000:]
    assert "served: predictions" in out and "torch" not in err
    client = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "client", "--config", str(toml)],
                            capture_output=True, text=True, env=env, timeout=60)
    assert client.returncode == 2 and client.stderr.count("\n") == 1, client.stderr[-2000:]
    assert "pip install 'edgefl[train]'" in client.stderr  # training needs torch: one line says how


def test_a_serve_config_error_is_one_line(tmp_path) -> None:
    from edge_sdk.serving import serve_from_toml

    with pytest.raises(ValueError, match=r"\[serve\] topic 'zigbee2mqtt/#' must be one exact topic"):
        serve_from_toml({"serve": {"inputs": [{"topic": "zigbee2mqtt/#"}]}})
    with pytest.raises(ValueError, match=r"\[serve\] inputs\[0\] must be a table"):
        serve_from_toml({"serve": {"inputs": [{"topik": "a"}]}})
    with pytest.raises(ValueError, match=r"\[serve\] period_s must be a number > 0"):
        serve_from_toml({"serve": {"inputs": [{"topic": "a"}], "period_s": 0}})


def test_a_new_model_is_swapped_in_between_windows_and_one_it_cannot_fill_is_not(tmp_path, broker, caplog) -> None:
    import logging
    from edge_sdk.networking.transport import IncomingMessage

    install_model(tmp_path, version=7)
    transport = MqttTransport(TransportConfig(url=broker.url, client_id="swap-serve"))
    transport.connect()
    server = Server(ServeConfig((ServeInput("home/power"),), max_per_s=1000.0), transport, Topics(job="home"),
                    "swap", tmp_path)
    readings = [str(100 + i % 7).encode() for i in range(LENGTH)]

    def window() -> list[dict]:
        out = [server.handle(IncomingMessage("home/power", r, False)) for r in readings]
        return [p for p in out if p is not None]

    try:
        assert [p["version"] for p in window()] == [7]
        for r in readings[:LENGTH // 2]:  # half a window, then version 8 is installed
            server.handle(IncomingMessage("home/power", r, False))
        time.sleep(0.01)  # model.json's mtime must move
        install_model(tmp_path, version=8, seed=1)
        later = [server.handle(IncomingMessage("home/power", r, False)) for r in readings]
        predicted = [p for p in later if p is not None]
        assert [p["version"] for p in predicted] == [8]  # the half window of version 7 was not finished by 8
        assert server.builder.counts.windows == 2
        time.sleep(0.01)
        with caplog.at_level(logging.ERROR, logger="edge_sdk.serving.served_model"):
            install_model(tmp_path, version=9, channels=2)  # the readings fill one channel, not two
            assert [p["version"] for p in window()] == [8]
        (line,) = [r.getMessage() for r in caplog.records if "cannot be served" in r.getMessage()]
        assert "it takes 2 channel(s); [serve] reads 1" in line and "the one before keeps serving" in line
    finally:
        transport.close()
        server.store.close()


def test_the_serving_connection_takes_its_own_user(tmp_path, broker) -> None:
    from edge_sdk.serving.serve_command import server_from_toml

    toml = tmp_path / "client.toml"
    base = (f'device_id = "pi"\njob = "home"\nstate_dir = "{tmp_path}"\n'
            f'[broker]\nurl = "{broker.url}"\nusername = "pi"\n')
    toml.write_text(base + f'[serve]\ninputs = [{{ topic = "home/power" }}]\nusername = "pi.serve"\n'
                           f'password_file = "{tmp_path / "missing"}"\n')
    with pytest.raises(ValueError, match=r"client.toml: \[serve\] password_file .*missing cannot be read"):
        server_from_toml(toml)
    (tmp_path / "serve.password").write_text("secret\n")
    toml.write_text(base + f'[serve]\ninputs = [{{ topic = "home/power" }}]\nusername = "pi.serve"\n'
                           f'password_file = "{tmp_path / "serve.password"}"\n')
    server = server_from_toml(toml)
    assert server is not None
    try:
        assert server.transport.config.username == "pi.serve" and server.transport.config.password == "secret"
    finally:
        server.close()
