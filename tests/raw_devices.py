"""Devices played by a test over bare MQTT connections: what a device sends, without its SDK."""

from __future__ import annotations

from edge_sdk.protocol.messages import Envelope, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.transport import MqttTransport, TransportConfig

__all__ = ["raw_device", "send_as"]


def raw_device(url: str, topics: Topics, device: str) -> MqttTransport:
    """A connection of ``device``'s, subscribed to its downlink."""
    transport = MqttTransport(TransportConfig(url=url, client_id=f"peer-{device}"))
    transport.connect()
    transport.subscribe(topics.downlink(device))
    return transport


def send_as(transport: MqttTransport, topics: Topics, device: str, body: object, rnd: int) -> None:
    """Publish ``body`` on ``device``'s uplink, as the device, for round ``rnd``."""
    transport.publish(topics.uplink(device), encode_envelope(Envelope.of(body, device, round=rnd)))
