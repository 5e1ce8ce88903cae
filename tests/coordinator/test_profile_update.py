"""A device's new measurement of its compute (`ProfileUpdate`, issue 36): the message, the coordinator
taking it over a real broker and re-assigning widths from the next round on, a device client that
re-measures when idle, and a hostile device's garbage refused."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.support.labels import assign, reassign

from coordinator.runtime.report import RunReport
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.device_budgets import FleetLimits
from coordinator.runtime.fleet import Fleet
from coordinator.strategies.flanc import Flanc
from coordinator.strategies.heterofl import HeteroFL
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.device import remeasure as remeasure_module
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data.datasets import load_dataset
from edge_sdk.networking.link import MessageLink
from edge_sdk.methods import LocalData
from edge_sdk.profiling import MeasureQuality, load_profile
from edge_sdk.protocol.codec import packb
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import (
    Ack, Envelope, Error, ProfileUpdate, Register, decode_envelope, encode_envelope,
)
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig

JOB = "remeasure"


# ----------------------------------------------------------------------------- the message


def _frame(body: dict, kind: str = "profile_update", sender: str = "pi") -> bytes:
    return packb({"v": 1, "kind": kind, "id": "x1", "reply_to": None, "round": -1, "sender": sender, "body": body})


def test_round_trip_and_defaults_for_a_minimal_body() -> None:
    update = ProfileUpdate(44.5, trials=10, spread=1.08, median_gflops=43.0, load_avg=0.2, others_cpu=0.03,
                           cpu_mhz=1800)
    env = decode_envelope(encode_envelope(Envelope.of(update, "pi")))
    assert env.body == update and isinstance(env.body.cpu_mhz, float)
    minimal = decode_envelope(_frame({"gflops": 3}, sender="pi")).body  # the rest optional; ints become floats
    assert minimal == ProfileUpdate(3.0) and minimal.load_avg == -1.0 and minimal.busy is False
    extra = decode_envelope(_frame({"gflops": 3.0, "battery": 0.5})).body  # unknown fields ignored
    assert extra == ProfileUpdate(3.0)


@pytest.mark.parametrize("body", [
    {}, {"gflops": 0}, {"gflops": -1.0}, {"gflops": float("nan")}, {"gflops": float("inf")}, {"gflops": 1e30},
    {"gflops": "150"}, {"gflops": True}, {"gflops": None}, {"gflops": [1.0]},
    {"gflops": 5.0, "trials": -1}, {"gflops": 5.0, "trials": 10**9}, {"gflops": 5.0, "trials": 2.5},
    {"gflops": 5.0, "spread": 0.5}, {"gflops": 5.0, "spread": float("nan")},
    {"gflops": 5.0, "median_gflops": -3.0}, {"gflops": 5.0, "load_avg": -2.0}, {"gflops": 5.0, "others_cpu": 1e9},
    {"gflops": 5.0, "cpu_mhz": float("inf")}, {"gflops": 5.0, "busy": "no"}, {"gflops": 5.0, "busy": 0},
    {"gflops": 5.0, "reason": "x" * 301}, {"gflops": 5.0, "reason": 7},
])
def test_every_field_is_checked(body: dict) -> None:
    with pytest.raises(ProtocolError) as err:
        decode_envelope(_frame(body))
    assert err.value.code == "malformed"
    if body.get("gflops") is not None and not isinstance(body.get("gflops"), (list, str)):
        with pytest.raises(ProtocolError):  # a sender cannot build one either
            ProfileUpdate(**body)


# ----------------------------------------------------------------------------- the coordinator


class Peer:
    """A hand-driven device on its own topics: raw publishes, and the replies it gets."""

    def __init__(self, url: str, device: str) -> None:
        self.device, self.topics = device, Topics(job=JOB)
        self.transport = MqttTransport(TransportConfig(url=url, client_id=f"{JOB}-{device}-{time.monotonic_ns()}"))
        self.transport.connect()
        self.transport.subscribe(self.topics.downlink(device))

    def send(self, body, sender: str | None = None, topic: str | None = None) -> str:
        env = Envelope.of(body, sender or self.device)
        self.transport.publish(topic or self.topics.uplink(self.device), encode_envelope(env))
        return env.msg_id

    def raw(self, payload: bytes) -> None:
        self.transport.publish(self.topics.uplink(self.device), payload)

    def reply(self, fleet: Fleet, timeout: float = 5.0) -> Envelope:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            fleet.pump(0.05)
            incoming = self.transport.receive(0.05)
            if incoming is not None:
                return decode_envelope(incoming.payload)
        raise AssertionError(f"no reply to {self.device}")


def _digits():
    return load_dataset("digits")


@pytest.fixture()
def job(broker, request):
    """A FLANC strategy (cluster assignment, static) with a fleet over the broker, the hooks wired as
    the round loop wires them; a slow device (Pi 3B, 1 GFLOPS) and a fast one (laptop) registered."""
    limits = getattr(request, "param", FleetLimits(error_reply_burst=100))
    data = _digits()
    strategy = Flanc.create(StrategyContext(FederationConfig(seed=0), "mlp", data.input_shape, data.num_classes))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{JOB}-coordinator-{time.monotonic_ns()}"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=JOB), limits=limits)
    RoundLoop(strategy, fleet, RunReport(method="flanc", config={}))  # wires the fleet's registrations to the method
    fleet.start()
    peers = {d: Peer(broker.url, d) for d in ("slow", "fast")}
    time.sleep(0.2)
    for device, profile in (("slow", "raspberry-pi-3b"), ("fast", "laptop")):
        msg_id = peers[device].send(Register(profile=load_profile(profile).to_dict(), num_samples=150))
        ack = peers[device].reply(fleet)
        assert isinstance(ack.body, Ack) and ack.reply_to == msg_id
    assert fleet.online() == ["fast", "slow"]
    assert (fleet.devices["slow"].label, fleet.devices["fast"].label) == ("0.25", "1.0")
    strategy.assigner.freeze()  # training started: static labels are frozen
    yield strategy, fleet, peers
    for peer in peers.values():
        peer.transport.close()
    transport.close()


def test_a_new_figure_reassigns_the_device_but_keeps_its_samples(job, caplog) -> None:
    strategy, fleet, peers = job
    slow = fleet.devices["slow"]
    slow.num_samples = 140  # what it had grown to: must not be reset
    assert strategy.configure_train(0, slow).label == "0.25"
    caplog.set_level(logging.INFO, logger="coordinator.runtime.fleet")
    msg_id = peers["slow"].send(ProfileUpdate(150.0, trials=10, spread=1.06, median_gflops=148.0, load_avg=0.1,
                                              others_cpu=0.02, cpu_mhz=2400.0))
    ack = peers["slow"].reply(fleet)
    assert isinstance(ack.body, Ack) and ack.reply_to == msg_id and "150" in ack.body.note
    assert slow.profile.gflops == 150.0 and slow.profile.name == "raspberry-pi-3b"  # only the figure moved
    assert slow.profile.ram_mb == load_profile("raspberry-pi-3b").ram_mb
    assert slow.num_samples == 140 and slow.online
    assert slow.profile.quality == MeasureQuality(trials=10, spread=1.06, median_gflops=148.0, load_avg=0.1,
                                                  others_cpu=0.02, cpu_mhz=2400.0)
    assert slow.profile.sources["gflops"].startswith("profile_update:")
    assert slow.label == "1.0" and fleet.devices["fast"].label == "1.0"  # frozen: the other keeps its width
    assert strategy.configure_train(1, slow).label == "1.0"  # its next plan is of the new width
    assert any("slow re-measured itself: 1 -> 150 GFLOPS" in r.getMessage() and "0.25 -> 1.0" in r.getMessage()
               for r in caplog.records)
    assert fleet.rejection_count == 0


@pytest.mark.slow
def test_an_update_during_a_round_applies_when_the_round_ends(job) -> None:
    strategy, fleet, peers = job
    slow = fleet.devices["slow"]
    strategy.configure_train(0, slow)
    result: dict = {}
    collector = threading.Thread(target=lambda: result.update(
        fleet.collect(0, ["slow"], 2.0, strategy.check_update).updates))
    collector.start()
    time.sleep(0.3)
    peers["slow"].send(ProfileUpdate(150.0, trials=10))
    incoming = peers["slow"].transport.receive(5.0)
    assert incoming is not None and isinstance(decode_envelope(incoming.payload).body, Ack)
    assert slow.label == "0.25" and slow.profile.gflops == 1.0  # not while its round is open
    collector.join(10.0)
    assert not collector.is_alive() and result == {}
    assert slow.profile.gflops == 150.0 and slow.label == "1.0"


def test_hostile_profile_updates_are_refused(job) -> None:
    strategy, fleet, peers = job
    fast, slow = fleet.devices["fast"], fleet.devices["slow"]
    cases = [  # (what, how it is sent, the code)
        ("another device's id as sender", lambda: peers["slow"].send(ProfileUpdate(0.01), sender="fast"),
         "sender_mismatch"),
        ("huge", lambda: peers["slow"].raw(_frame({"gflops": 1e30}, sender="slow")), "malformed"),
        ("NaN", lambda: peers["slow"].raw(_frame({"gflops": float("nan")}, sender="slow")), "malformed"),
        ("a string", lambda: peers["slow"].raw(_frame({"gflops": "fast"}, sender="slow")), "malformed"),
        ("garbage", lambda: peers["slow"].raw(b"\x93\x01garbage"), "malformed"),
        ("a long reason", lambda: peers["slow"].raw(_frame({"gflops": 9.0, "reason": "r" * 5000}, sender="slow")),
         "malformed"),
        ("busy by its own word", lambda: peers["slow"].send(ProfileUpdate(9.0, busy=True, reason="x")), "bad_profile"),
    ]
    for what, send, code in cases:
        send()
        reply = peers["slow"].reply(fleet)
        assert isinstance(reply.body, Error) and reply.body.code == code, (what, reply.body)
    assert fast.profile.gflops == load_profile("laptop").gflops and fast.label == "1.0"
    assert slow.profile.gflops == 1.0 and slow.label == "0.25" and slow.num_samples == 150
    # a stranger (never registered) and a profile update on a status topic change nothing
    stranger = Peer(peers["slow"].transport.config.url, "stranger")
    try:
        stranger.send(ProfileUpdate(500.0))
        assert stranger.reply(fleet).body.code == "unknown_device"
    finally:
        stranger.transport.close()
    peers["slow"].send(ProfileUpdate(500.0), topic=Topics(job=JOB).status("slow"))
    fleet.pump(0.5)
    assert slow.profile.gflops == 1.0 and "stranger" not in fleet.devices


@pytest.mark.parametrize("job", [FleetLimits(error_reply_burst=100, profile_update_interval_s=3600.0,
                                             profile_update_burst=2)], indirect=True)
def test_profile_updates_are_rate_limited(job) -> None:
    strategy, fleet, peers = job
    for gflops in (150.0, 2.0):
        peers["slow"].send(ProfileUpdate(gflops))
        assert isinstance(peers["slow"].reply(fleet).body, Ack)
    peers["slow"].send(ProfileUpdate(150.0))
    reply = peers["slow"].reply(fleet)
    assert reply.body.code == "rate_limited" and "3600" in reply.body.message
    assert fleet.devices["slow"].profile.gflops == 2.0 and fleet.devices["slow"].label == "0.25"


def test_heterofl_dynamic_relabels_the_fleet() -> None:
    """In dynamic mode a new figure relabels everyone (cluster assignment is relative to the fleet)."""
    from coordinator.core.device_record import DeviceRecord

    data = _digits()
    strategy = HeteroFL.create(StrategyContext(FederationConfig(seed=0), "mlp", data.input_shape, data.num_classes,
                                               options={"dynamic": "true"}))
    records = {d: DeviceRecord(d, load_profile(p), 100) for d, p in
               (("a", "raspberry-pi-3b"), ("b", "raspberry-pi-4b"), ("c", "laptop"))}
    for record in records.values():
        assign(strategy, record, records.values())
    assert [records[d].label for d in "abc"] == ["0.25", "0.75", "1.0"]  # 3 groups over 4 widths
    strategy.assigner.freeze()
    records["a"].profile = load_profile("laptop")  # its new figure
    reassign(strategy, records["a"], records.values())
    assert records["a"].label == "1.0" and records["b"].label == "0.25"  # b is now the slowest group


def test_methods_that_fix_one_model_keep_it() -> None:
    """FedAvg trains one model for all: a new figure changes no label."""
    from coordinator.core.device_record import DeviceRecord
    from coordinator.strategies.fedavg import FedAvg
    from edge_sdk.models.zoo import mlp

    strategy = FedAvg(FederationConfig(seed=0), mlp(in_features=16, num_classes=3, hidden=(8,)))
    record = DeviceRecord("a", load_profile("raspberry-pi-3b"), 100)
    record.label = strategy.assign(record)
    label = record.label
    record.profile = load_profile("laptop")
    record.label = strategy.reassign(record)
    assert record.label == label


# ----------------------------------------------------------------------------- the device client


class _IdleWatch:
    """CpuWatch stand-in: the rest of the machine is idle (or as busy as told)."""

    others_cpu = 0.0

    def __init__(self) -> None:
        self.cpus = [0, 1]

    def others(self) -> float:
        return self.others_cpu


def _detail(gflops: float, busy: bool = False) -> dict:
    quality = MeasureQuality(trials=10, spread=2.0 if busy else 1.05, median_gflops=gflops * 0.97, load_avg=0.1,
                             others_cpu=1.5 if busy else 0.01, busy=busy, reason="busy" if busy else "")
    return {"conv_train_gflops": gflops, "matmul_gflops": gflops * 2, "conv_shape": "32->32ch 3x3 16x16",
            "conv_batch": 128, "dtype": "float32", "device": "cpu", "threads": 1, "torch": "x", "quality": quality}


@pytest.mark.slow
def test_a_client_remeasures_when_idle_and_the_coordinator_reassigns_it(broker, monkeypatch) -> None:
    monkeypatch.setattr(remeasure_module, "IDLE_WATCH_S", 0.2)
    monkeypatch.setattr(remeasure_module, "CpuWatch", _IdleWatch)
    data = _digits()
    strategy = Flanc.create(StrategyContext(FederationConfig(seed=0), "mlp", data.input_shape, data.num_classes))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{JOB}-coord-client-{time.monotonic_ns()}"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=JOB))
    RoundLoop(strategy, fleet, RunReport(method="flanc", config={}))  # wires the fleet's registrations to the method
    fleet.start()
    clients = {}
    for device, profile in (("pi", "raspberry-pi-3b"), ("laptop", "laptop")):
        config = ClientConfig(device_id=device, transport=TransportConfig(url=broker.url, client_id=f"{JOB}-{device}"),
                              job=JOB, register_retry_s=0.5, remeasure_every_s=0.0 if device == "laptop" else 1.0)
        clients[device] = DeviceClient(config, LocalData(data.x_train[:120], data.y_train[:120], data.num_classes),
                                       load_profile(profile))
    pi = clients["pi"]
    measured = [_detail(90.0, busy=True), _detail(150.0), _detail(160.0)]  # busy: not sent; then 150; then 160s
    pi.remeasuring.measure = lambda: measured.pop(0) if len(measured) > 1 else measured[0]
    threads = [threading.Thread(target=c.run, kwargs={"timeout_s": 30.0}, daemon=True) for c in clients.values()]
    for thread in threads:
        thread.start()
    try:
        assert fleet.wait_for_devices(2, 10.0) == ["laptop", "pi"]
        record = fleet.devices["pi"]
        assert record.label == "0.25" and record.num_samples == 120
        strategy.assigner.freeze()
        end = time.monotonic() + 15.0
        while time.monotonic() < end and record.profile.gflops != 150.0:
            fleet.pump(0.2)
        assert record.profile.gflops == 150.0 and record.label == "1.0" and record.num_samples == 120
        assert [u.gflops for u in pi.profile_updates] == [150.0]  # the busy 90 was never sent
        assert pi.profile.gflops == 150.0 and pi.profile.quality.trials == 10
        end = time.monotonic() + 4.0  # the next one (160) is within 25 % of 150: not sent
        while time.monotonic() < end:
            fleet.pump(0.2)
        assert [u.gflops for u in pi.profile_updates] == [150.0] and record.profile.gflops == 150.0
        assert not any(device == "pi" for device, _, _ in fleet.rejections)
    finally:
        for c in clients.values():
            c.stop()
        for thread in threads:
            thread.join(5.0)
        transport.close()


def test_a_client_stops_remeasuring_when_an_old_coordinator_does_not_know_the_kind() -> None:
    data = _digits()
    pi = DeviceClient(ClientConfig(device_id="pi", remeasure_every_s=60.0),
                      LocalData(data.x_train[:10], data.y_train[:10], data.num_classes), load_profile("raspberry-pi-3b"))
    pi.remeasuring.update_id = "abc"
    pi._handle(Envelope.of(Error("kind", "unknown message kind 'profile_update'"), "coordinator", reply_to="abc"))
    assert pi.remeasuring.next_at == float("inf")


def test_a_busy_start_up_figure_is_measured_again_sooner(caplog) -> None:
    data = _digits()
    busy = load_profile("raspberry-pi-3b")
    from dataclasses import replace
    busy = replace(busy, quality=MeasureQuality(trials=10, busy=True, reason="x"))
    local = LocalData(data.x_train[:10], data.y_train[:10], data.num_classes)
    soon = DeviceClient(ClientConfig(device_id="pi", remeasure_every_s=3600.0), local, busy)
    late = DeviceClient(ClientConfig(device_id="pi", remeasure_every_s=3600.0), local, load_profile("raspberry-pi-3b"))
    assert soon.remeasuring.next_at < late.remeasuring.next_at - 3000
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "while busy (x): measuring again when idle, in 300 s" in warned[0]
