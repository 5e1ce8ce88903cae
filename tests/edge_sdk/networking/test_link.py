"""The message link over a real broker: chunking under the broker's packet limit, stalls reported."""

from __future__ import annotations

import time

import numpy as np
import pytest

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from coordinator.runtime.fleet import Fleet
from edge_sdk.networking.link import LinkConfig, MessageLink, Received
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.chunking import split_envelope_payload
from edge_sdk.protocol.messages import Envelope, Error, Register, Update, decode_envelope, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.requirements import require

SMALL_PACKETS = 64 * 1024


@pytest.fixture(scope="module")
def small_packet_broker():
    require("mosquitto")  # amqtt announces no maximum packet size
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto", max_packet_size=SMALL_PACKETS)) as b:
        yield b


def _pair(url: str, topic: str, config: LinkConfig = LinkConfig()) -> tuple[MessageLink, MessageLink]:
    a = MqttTransport(TransportConfig(url=url, client_id=f"a-{time.monotonic_ns()}"))
    b = MqttTransport(TransportConfig(url=url, client_id=f"b-{time.monotonic_ns()}"))
    a.connect()
    b.connect()
    b.subscribe(topic)
    time.sleep(0.2)
    return MessageLink(a, config), MessageLink(b, config)


def test_big_update_is_chunked_below_the_brokers_packet_limit(small_packet_broker):
    topic = "test/link/big"
    sender, receiver = _pair(small_packet_broker.url, topic)
    assert sender.transport.max_packet_size == SMALL_PACKETS
    assert sender.effective_chunk_size() <= SMALL_PACKETS - 1024
    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((512, 512)).astype(np.float32),
               "b": rng.standard_normal(512).astype(np.float32)}
    sent = sender.send(topic, Envelope.of(Update("global", tensors, 7, {"loss": 0.5}), "dev1", round=3))
    item = receiver.poll(10.0)
    assert isinstance(item, Received)
    update = item.envelope.body
    assert item.envelope.round == 3 and item.envelope.sender == "dev1"
    assert update.num_samples == 7
    for name in tensors:
        np.testing.assert_array_equal(update.tensors[name], tensors[name])
    raw = sum(t.nbytes for t in tensors.values())
    assert item.nbytes == sent == sender.bytes_sent
    assert raw < sent <= 1.01 * raw + 1024 * (sent // SMALL_PACKETS + 1)
    sender.transport.close()
    receiver.transport.close()


def test_fp16_transfer_halves_the_bytes(broker):
    topic = "test/link/fp16"
    sender, receiver = _pair(broker.url, topic, LinkConfig(transfer_dtype="float16"))
    tensors = {"w": np.linspace(-1, 1, 100_000, dtype=np.float32)}
    sent = sender.send(topic, Envelope.of(Update("global", tensors, 1, {}), "dev1", round=0))
    item = receiver.poll(10.0)
    assert item.envelope.body.tensors["w"].dtype == np.float16
    np.testing.assert_allclose(item.envelope.body.tensors["w"], tensors["w"], atol=1e-3)
    assert sent < 0.51 * tensors["w"].nbytes + 1024
    sender.transport.close()
    receiver.transport.close()


@pytest.mark.slow
def test_a_stalled_transfer_is_reported_to_its_sender(broker):
    """A device whose chunks stop arriving gets an 'incomplete' error; nothing is delivered."""
    topics = Topics(job="stall")
    coord_transport = MqttTransport(TransportConfig(url=broker.url, client_id="stall-coordinator"))
    coord_transport.connect()
    fleet = Fleet(MessageLink(coord_transport, LinkConfig(reassembly_timeout_s=0.5)), topics)
    fleet.start()
    device = MqttTransport(TransportConfig(url=broker.url, client_id="stall-device"))
    device.connect()
    device.subscribe(topics.downlink("dev9"))
    time.sleep(0.2)
    register = Envelope.of(Register(profile=load_profile("raspberry-pi-3b").to_dict(), num_samples=10), "dev9")
    device.publish(topics.uplink("dev9"), encode_envelope(register))
    assert fleet.wait_for_devices(1, 5.0) == ["dev9"]
    assert device.receive(5.0) is not None  # the registration ack
    payload = encode_envelope(Envelope.of(
        Update("global", {"w": np.ones(50_000, np.float32)}, 10, {}), "dev9", round=0))
    frames = split_envelope_payload(payload, "dev9", 0, 16 * 1024)
    assert len(frames) > 3
    for frame in frames[:-1]:  # the last chunk never arrives
        device.publish(topics.uplink("dev9"), frame)
    fleet.pump(1.5)
    fleet.pump(0.2)
    reply = decode_envelope(device.receive(5.0).payload)
    assert isinstance(reply.body, Error) and reply.body.code == "incomplete"
    assert f"{len(frames) - 1}/{len(frames)}" in reply.body.message
    assert [code for _, code, _ in fleet.rejections] == ["incomplete"]
    device.close()
    coord_transport.close()


def test_a_long_wait_ends_early_while_a_message_is_half_received(broker):
    """A device chose its wait (until its heartbeat, say) before a chunked message began: `poll`
    with ``wake_on_partial`` returns within about `PARTIAL_WAKE_S` of a chunk that leaves it half
    received, so the device can notice in time that it stalled; a message that completes is
    returned whole."""
    sender, receiver = _pair(broker.url, "half/received")
    payload = encode_envelope(Envelope.of(Update("global", {"w": np.ones(50_000, np.float32)}, 10, {}), "dev7",
                                          round=0))
    frames = split_envelope_payload(payload, "dev7", 0, 16 * 1024)
    assert len(frames) > 3
    for frame in frames[:-1]:  # the last chunk never arrives
        sender.transport.publish("half/received", frame)
    started = time.monotonic()
    assert receiver.poll(30.0, wake_on_partial=True) is None
    assert time.monotonic() - started < 5.0 and receiver.pending_transfers()
    sender.transport.publish("half/received", frames[-1])
    got = receiver.poll(30.0, wake_on_partial=True)
    while got is None and time.monotonic() - started < 10.0:
        got = receiver.poll(30.0, wake_on_partial=True)
    assert isinstance(got, Received) and isinstance(got.envelope.body, Update)
    sender.transport.close()
    receiver.transport.close()
