"""The fleet in Home Assistant over a real mosquitto (issue 41): a job with Home Assistant's discovery
on publishes the coordinator and its devices, publishes again on Home Assistant's birth message,
pauses and resumes between rounds from its command topic, and clears a removed device."""

from __future__ import annotations

import json
import threading
import time

import pytest

from coordinator.homeassistant import HomeAssistantConfig
from coordinator.homeassistant.discovery import HaTopics
from coordinator.core.federation import EvalData, FederationConfig
from coordinator.runtime.job import JobConnection, run_job
from coordinator.runtime.report import RunReport
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods import LocalData
from edge_sdk.data.partition import partition
from edge_sdk.profiling import load_profile
from edge_sdk.training import TrainConfig
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.fleet_job import clients_beside
from tests.support.homeassistant_rules import validate_device_discovery

pytestmark = pytest.mark.slow


class Observer:
    """Home Assistant's view: every message under the discovery prefix and the job's ha/ topics."""

    def __init__(self, url: str, prefix: str, job: str) -> None:
        self.transport = MqttTransport(TransportConfig(url=url, client_id=f"observer-{job}"))
        self.transport.connect()
        self.transport.subscribe(f"{prefix}/#")
        self.transport.subscribe(f"edgefl/{job}/ha/#")
        self.messages: list[tuple[str, bytes]] = []

    def drain(self, seconds: float = 0.2) -> list[tuple[str, bytes]]:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if (msg := self.transport.receive(timeout=left)) is not None:
                self.messages.append((msg.topic, msg.payload))
        return self.messages

    def wait_for(self, check, timeout: float = 30.0, what: str = "") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.drain(0.2)
            if check():
                return
        raise AssertionError(f"not seen within {timeout} s: {what}")

    def last(self, topic: str) -> bytes | None:
        return next((p for t, p in reversed(self.messages) if t == topic), None)

    def state(self, topic: str) -> dict:
        payload = self.last(topic)
        return json.loads(payload) if payload else {}


def test_a_job_in_home_assistant(mosquitto_broker, tmp_path):
    job, prefix = "ha-job", "hatest"
    topics = HaTopics(job, prefix)
    digits = load_dataset("digits")
    removed = tmp_path / "removed-devices"
    checkpoints = tmp_path / "checkpoints"
    config = FederationConfig(rounds=4, min_devices=2, round_deadline_s=60, seed=0, publish=False,
                              federated_eval=False, checkpoint_dir=str(checkpoints),
                              train=TrainConfig(epochs=1, lr=0.05))
    strategy = FedAvg.create(StrategyContext(config, "mlp", digits.input_shape, digits.num_classes))
    home = HomeAssistantConfig(enabled=True, prefix=prefix, birth_topic=f"{prefix}/status")
    connection = JobConnection(TransportConfig(url=mosquitto_broker.url, client_id=f"{job}-coordinator"), job,
                               homeassistant=home, removed_devices=str(removed))
    observer = Observer(mosquitto_broker.url, prefix, job)
    # the job starts paused: the command arrives before it (a retained command would be a bug: not sent so)
    pauser = MqttTransport(TransportConfig(url=mosquitto_broker.url, client_id="ha-user"))
    pauser.connect()

    clients = []
    for name, shard in zip(("pi-a", "pi-b"), partition(digits.y_train, 2, "iid", seed=0)):
        clients.append(DeviceClient(ClientConfig(device_id=name, job=job, seed=0,
                                                 transport=TransportConfig(url=mosquitto_broker.url, client_id=name)),
                                    LocalData(digits.x_train[shard], digits.y_train[shard], digits.num_classes),
                                    load_profile("raspberry-pi-4b")))

    devices = clients_beside(clients)

    rounds_seen: list[int] = []
    outcome: dict = {}
    pause_sent = threading.Event()

    def on_round(record) -> None:
        rounds_seen.append(record.round)
        if record.round == 0:  # the pause arrives while round 1 ends: the job holds before round 2
            pause_sent.wait(30)

    def job_thread() -> None:
        try:
            outcome["report"] = run_job(strategy, RunReport(method="fedavg", config={}), connection, tmp_path / "out",
                                        beside=devices, eval_data=EvalData(digits.x_test, digits.y_test), on_round=on_round, plots=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc

    runner = threading.Thread(target=job_thread, daemon=True)
    runner.start()
    coordinator_config = topics.discovery(topics.coordinator_node)
    device_configs = {d: topics.discovery(topics.device_node(d)) for d in ("pi-a", "pi-b")}
    observer.wait_for(lambda: all(observer.last(t) for t in [coordinator_config, *device_configs.values()]),
                      what="discovery of the coordinator and both devices")
    for topic in [coordinator_config, *device_configs.values()]:
        problems = validate_device_discovery(topic, json.loads(observer.last(topic)), prefix=prefix)
        assert problems == [], (topic, problems)
    assert observer.last(topics.coordinator_availability) == b"online"

    # pause after the first round
    observer.wait_for(lambda: rounds_seen, what="round 1")
    pauser.publish(topics.command, b"pause")
    assert pauser.wait_published(5)
    time.sleep(0.5)  # delivered to the coordinator meanwhile (it takes ms)
    pause_sent.set()
    observer.wait_for(lambda: observer.state(topics.coordinator_state).get("state") == "paused", what="paused")
    held_at = len(rounds_seen)
    assert held_at == 1
    assert (checkpoints / "paused").exists()  # a restarted coordinator stays paused
    pauser.publish(topics.command, b"reboot now")  # not a command: ignored
    # Home Assistant restarts: discovery again
    before = sum(1 for t, _ in observer.messages if t == coordinator_config)
    pauser.publish(f"{prefix}/status", b"online", retain=False)
    observer.wait_for(lambda: sum(1 for t, _ in observer.messages if t == coordinator_config) > before,
                      what="discovery again after the birth message")
    # pi-b removed (remove-device.sh appends its id): cleared from Home Assistant
    removed.write_text("pi-b\n")
    # its discovery, state and availability are cleared in that order: wait for the last of them
    observer.wait_for(lambda: observer.last(topics.device_availability("pi-b")) == b"", what="pi-b cleared")
    assert observer.last(device_configs["pi-b"]) == b"" and observer.last(topics.device_state("pi-b")) == b""
    time.sleep(1.0)
    assert len(rounds_seen) == held_at  # still paused
    pauser.publish(topics.command, b"resume")
    runner.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert [r.round for r in report.rounds] == [0, 1, 2, 3]
    assert all(r.participants == ["pi-a"] for r in report.rounds[held_at:])  # pi-b never sampled again
    assert not (checkpoints / "paused").exists()
    observer.drain(1.0)
    state = observer.state(topics.coordinator_state)
    assert state["state"] == "finished" and state["round"] == 4 and state["rounds"] == 4
    assert state["bytes_up"] == sum(r.bytes_up for r in report.rounds) > 0
    assert 0 < state["accuracy"]["global"] <= 100
    # the final figures stay readable: available, its state says finished (a crash: offline, its will)
    assert observer.last(topics.coordinator_availability) == b"online"
    pi_a = observer.state(topics.device_state("pi-a"))
    assert pi_a["last_round"] == 4 and pi_a["label"] == "global" and pi_a["bytes_up"] > 0
    # a label's accuracy got its entity once the job had it
    config = json.loads(observer.last(coordinator_config))
    assert "accuracy_global" in config["cmps"]
    observer.transport.close()
    pauser.close()
