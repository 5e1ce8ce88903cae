"""The coordinator counts a published model as installed by the `ack` that answers its message
(``reply_to`` = the model message's ``id``), never by the wording of the ack's note."""

from __future__ import annotations

import threading

import pytest

from coordinator.core.device_record import DeviceRecord
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.publish import publish_models
from edge_sdk.networking.link import MessageLink
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import mlp
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Model
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig

pytest.importorskip("onnxruntime")
DEVICE = "pi-ack"


def _fake_device(url: str, topics: Topics, reply_to_of, answered: list[str], ready: threading.Event) -> None:
    """A device that answers the first model it gets with the note of an installed model and the
    ``reply_to`` that ``reply_to_of(model message id)`` gives."""
    transport = MqttTransport(TransportConfig(url=url, client_id=f"{topics.job}-{DEVICE}"))
    transport.subscribe(topics.downlink(DEVICE))
    transport.connect()
    link = MessageLink(transport)
    ready.set()
    try:
        for _ in range(100):
            item = link.poll(0.1)
            env = getattr(item, "envelope", None)
            if env is not None and isinstance(env.body, Model):
                answered.append(env.msg_id)
                ack = Ack(f"model for round {env.body.round + 1} installed")
                link.send(topics.uplink(DEVICE), Envelope.of(ack, DEVICE, env.round, reply_to_of(env.msg_id)))
                transport.wait_published(5.0)
                return
    finally:
        transport.close()


@pytest.mark.parametrize("right_reply_to", [True, False], ids=["reply_to-matches", "reply_to-wrong"])
def test_only_an_ack_answering_the_model_message_counts_as_installed(broker, right_reply_to) -> None:
    topics = Topics(job=f"publish-acks-{int(right_reply_to)}")
    reply_to_of = (lambda msg_id: msg_id) if right_reply_to else (lambda msg_id: f"not-{msg_id}")
    answered: list[str] = []
    ready = threading.Event()
    device = threading.Thread(target=_fake_device, args=(broker.url, topics, reply_to_of, answered, ready),
                              daemon=True)
    device.start()
    assert ready.wait(10.0)
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{topics.job}-coordinator"))
    transport.connect()
    try:
        fleet = Fleet(MessageLink(transport), topics)
        fleet.start()
        fleet.devices[DEVICE] = DeviceRecord(DEVICE, load_profile("raspberry-pi-4b"), 20, label="global")
        model = build_model(mlp(8, 3, hidden=(16,)))
        published, = publish_models(lambda label: model, fleet, 0, wait_s=3.0 if right_reply_to else 2.0)
    finally:
        device.join(timeout=10.0)
        transport.close()
    record = fleet.devices[DEVICE]
    assert len(answered) == 1 and record.last_ack == "model for round 1 installed"  # the note arrived either way
    assert published.devices == (DEVICE,)
    assert published.acknowledged == ((DEVICE,) if right_reply_to else ())
    assert record.acknowledged(answered[0]) is right_reply_to
