"""Bad updates over a real broker: each is rejected, reported to the sender, never aggregated."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from coordinator.aggregate.validation import MAX_SAMPLES
from coordinator.runtime.device_budgets import FleetLimits
from coordinator.runtime.fleet import Fleet
from coordinator.strategies.fedavg import FedAvg
from coordinator.core.federation import FederationConfig
from edge_sdk.networking.link import MessageLink
from edge_sdk.models.zoo import mlp
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.codec import packb
from edge_sdk.protocol.messages import (Ack, Envelope, Error, Register, Status, Update, decode_envelope,
                                        encode_envelope)
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig

JOB = "rejects"
DEVICE = "rogue"


class Peer:
    """A hand-driven device: raw publishes, and the replies it gets."""

    def __init__(self, url: str) -> None:
        self.topics = Topics(job=JOB)
        self.transport = MqttTransport(TransportConfig(url=url, client_id="rogue-peer"))
        self.transport.connect()
        self.transport.subscribe(self.topics.downlink(DEVICE))

    def send(self, body, rnd: int = 0, sender: str = DEVICE) -> str:
        env = Envelope.of(body, sender, round=rnd)
        self.transport.publish(self.topics.uplink(DEVICE), encode_envelope(env))
        return env.msg_id

    def raw(self, payload: bytes) -> None:
        self.transport.publish(self.topics.uplink(DEVICE), payload)

    def reply(self, timeout: float = 5.0) -> Envelope:
        incoming = self.transport.receive(timeout)
        assert incoming is not None, "no reply from the coordinator"
        return decode_envelope(incoming.payload)


@pytest.fixture()
def setup(broker):
    strategy = FedAvg(FederationConfig(seed=0), mlp(in_features=16, num_classes=3, hidden=(8,)))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id="rejects-coordinator"))
    transport.connect()
    # every rejection answered here (the error-reply budget is tested in tests/fleet/test_hostile_device.py)
    fleet = Fleet(MessageLink(transport), Topics(job=JOB), on_register=lambda device: setattr(device, "label", strategy.assign(device)),
                  limits=FleetLimits(error_reply_burst=100))
    fleet.start()
    peer = Peer(broker.url)
    time.sleep(0.2)
    register_id = peer.send(Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50), rnd=-1)
    assert fleet.wait_for_devices(1, 5.0) == [DEVICE]
    ack = peer.reply()
    assert isinstance(ack.body, Ack) and ack.reply_to == register_id
    yield strategy, fleet, peer
    peer.transport.close()
    transport.close()


def _good_tensors(strategy: FedAvg) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in strategy.weights.items()}


@pytest.mark.slow
def test_every_bad_update_is_rejected_and_reported(setup):
    strategy, fleet, peer = setup
    good = _good_tensors(strategy)
    name = next(iter(good))
    nan = dict(good, **{name: np.full_like(good[name], np.nan)})
    inf = dict(good, **{name: np.full_like(good[name], np.inf)})
    wrong_shape = dict(good, **{name: np.zeros((3, 3), np.float32)})
    wrong_dtype = dict(good, **{name: good[name].astype(np.int32)})
    missing = {k: v for k, v in good.items() if k != name}
    cases = [
        (Update("global", nan, 10, {}), 0, DEVICE, "nonfinite"),
        (Update("global", inf, 10, {}), 0, DEVICE, "nonfinite"),
        (Update("global", wrong_shape, 10, {}), 0, DEVICE, "bad_shape"),
        (Update("global", wrong_dtype, 10, {}), 0, DEVICE, "bad_dtype"),
        (Update("global", missing, 10, {}), 0, DEVICE, "bad_tensors"),
        (Update("global", good, 0, {}), 0, DEVICE, "bad_samples"),
        # more than any count could grow to (more than it registered weighs what growth allows:
        # tests/coordinator/test_growing_data.py)
        (Update("global", good, MAX_SAMPLES + 1, {}), 0, DEVICE, "bad_samples"),
        (Update("global", good, 10, {"loss": float("nan")}), 0, DEVICE, "nonfinite"),
        (Update("0.5", good, 10, {}), 0, DEVICE, "wrong_label"),
        (Update("global", good, 10, {}), 7, DEVICE, "wrong_round"),
        (Update("global", good, 10, {}), 0, "someone-else", "sender_mismatch"),
    ]
    result: dict = {}
    collector = threading.Thread(
        target=lambda: result.update(fleet.collect(0, [DEVICE], 20.0, strategy.check_update).updates))
    collector.start()
    time.sleep(0.2)
    for body, rnd, sender, code in cases:
        msg_id = peer.send(body, rnd=rnd, sender=sender)
        reply = peer.reply()
        assert isinstance(reply.body, Error), (code, reply)
        assert reply.body.code == code, (code, reply.body)
        assert reply.reply_to == msg_id
    # malformed frames: garbage, an unknown schema version, an unknown kind
    peer.raw(b"\x00garbage\xff")
    assert peer.reply().body.code == "malformed"
    peer.raw(packb({"v": 99, "kind": "update", "id": "x", "reply_to": None, "round": 0,
                    "sender": DEVICE, "body": {}}))
    assert peer.reply().body.code == "version"
    peer.raw(packb({"v": 1, "kind": "teleport", "id": "x", "reply_to": None, "round": 0,
                    "sender": DEVICE, "body": {}}))
    assert peer.reply().body.code == "kind"
    # the one good update is accepted, and only it is collected
    ok_id = peer.send(Update("global", good, 10, {"loss": 0.5}), rnd=0)
    ack = peer.reply()
    assert isinstance(ack.body, Ack) and ack.reply_to == ok_id
    collector.join(timeout=10)
    assert list(result) == [DEVICE]
    assert result[DEVICE].update.num_samples == 10
    assert all(np.isfinite(t).all() for t in result[DEVICE].update.tensors.values())
    codes = [code for _, code, _ in fleet.rejections]
    assert len(codes) == len(cases) + 3


def test_update_outside_a_round_and_from_strangers(setup):
    strategy, fleet, peer = setup
    peer.send(Update("global", _good_tensors(strategy), 10, {}), rnd=0)
    fleet.pump(1.0)
    assert peer.reply().body.code == "wrong_round"  # no round is open


def test_a_registration_with_an_impossible_availability_is_refused_in_one_line(setup):
    """``availability.*`` belongs in profile files, never sent by an SDK; what a hostile one sends
    there is validated like every profile field: refused, the device's record unchanged."""
    strategy, fleet, peer = setup
    before = fleet.devices[DEVICE].profile
    for bad in ({"availability.online_fraction": 7.0}, {"availability.online_fraction": 0.5, "availability.x": 1},
                {"availability.source": "s" * 5000, "availability.online_fraction": 0.5}):
        peer.send(Register(profile={**load_profile("raspberry-pi-4b").to_dict(), **bad}, num_samples=50), rnd=-1)
        fleet.pump(1.0)
        reply = peer.reply().body
        assert isinstance(reply, Error) and reply.code == "bad_profile" and "availability" in reply.message
        assert "\n" not in reply.message
    assert fleet.devices[DEVICE].profile == before and fleet.devices[DEVICE].profile.availability is None


def test_a_device_that_declines_does_not_hold_the_round_open(setup):
    strategy, fleet, peer = setup
    result: dict = {}
    started = time.monotonic()
    collector = threading.Thread(
        target=lambda: result.update(fleet.collect(0, [DEVICE], 30.0, strategy.check_update).updates))
    collector.start()
    time.sleep(0.2)
    peer.send(Error("not_training", "outside the training window 22:00-06:30"), rnd=0)
    collector.join(timeout=15)
    assert not collector.is_alive()
    assert result == {}
    assert time.monotonic() - started < 15  # closed long before the 30 s deadline


def test_a_removed_device_is_not_heard_nor_waited_for(setup):
    """remove-device.sh took it out (coordinator/runtime/removed_devices.py): its connection may
    stay open, but its registration is refused, its status and update are not heard, and a round it
    was asked in closes without waiting out the rejoin grace."""
    strategy, fleet, peer = setup
    removed: list[str] = []
    fleet.on_removed = removed.append
    fleet.remove(DEVICE)
    assert removed == [DEVICE] and fleet.online() == [] and fleet.devices[DEVICE].state == "removed"
    peer.send(Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50), rnd=-1)
    fleet.pump(1.0)
    refused = peer.reply()
    assert refused.body.code == "unknown_device" and "removed" in refused.body.message
    peer.send(Status("online", "back"), rnd=-1)
    fleet.pump(0.5)
    assert fleet.online() == []
    started = time.monotonic()
    peer.send(Update("global", _good_tensors(strategy), 10, {}), rnd=0)
    collected = fleet.collect(0, [DEVICE], 30.0, strategy.check_update)
    assert collected.updates == {} and time.monotonic() - started < 5.0  # the rejoin grace is 15 s


def test_the_rejection_log_is_bounded_but_counts_everything(setup):
    from coordinator.runtime.fleet import MAX_KEPT_REJECTIONS
    fleet = setup[1]
    for i in range(MAX_KEPT_REJECTIONS + 5):
        fleet._reject(f"flood{i % 3}", "malformed", "x" * 5000)
    assert len(fleet.rejections) == MAX_KEPT_REJECTIONS and fleet.rejection_count >= MAX_KEPT_REJECTIONS + 5
    assert fleet.rejections[-1][0] == f"flood{(MAX_KEPT_REJECTIONS + 4) % 3}"
    assert max(len(m) for _, _, m in fleet.rejections) <= 1000


def test_counts_and_statistics_weigh_no_more_than_the_samples_a_device_is_believed_to_hold(setup):
    """A hostile `data_count` and `fleet_stats` (a billion new samples, a billion-sample mean): the
    count is believed as far as the growth limits allow, the statistics weigh that much; one sent
    under another device's name is refused, as every message is."""
    from edge_sdk.protocol.messages import DataCount, FleetStats

    _strategy, fleet, peer = setup
    peer.send(DataCount(training=10**9, new=10**9, held_out=5))
    peer.send(FleetStats("channel_moments", 10**9, (1e6,), (1e12,)))
    record = fleet.devices[DEVICE]
    end = time.monotonic() + 5
    while time.monotonic() < end and "channel_moments" not in record.stats:
        fleet.pump(0.2)
    assert record.num_samples < 10**6 and record.new_samples <= record.num_samples
    assert record.stats["channel_moments"].count == record.num_samples
    peer.send(DataCount(training=60, new=60), sender="someone-else")
    fleet.pump(1.0)
    assert peer.reply().body.code == "sender_mismatch"
