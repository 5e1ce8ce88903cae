"""Devices played by a test over bare MQTT connections: what a device sends, without its SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from coordinator.runtime.device_budgets import FleetLimits
from coordinator.core.federation import FederationConfig
from coordinator.runtime.fleet import Fleet
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.networking.link import MessageLink
from edge_sdk.models.zoo import mlp
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Register, decode_envelope, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.networking.transport import MqttTransport, TransportConfig

__all__ = ["raw_device", "register_all", "registered_fleet", "send_as"]


def raw_device(url: str, topics: Topics, device: str) -> MqttTransport:
    """A connection of ``device``'s, subscribed to its downlink."""
    transport = MqttTransport(TransportConfig(url=url, client_id=f"peer-{device}"))
    transport.connect()
    transport.subscribe(topics.downlink(device))
    return transport


def send_as(transport: MqttTransport, topics: Topics, device: str, body: object, rnd: int) -> None:
    """Publish ``body`` on ``device``'s uplink, as the device, for round ``rnd``."""
    transport.publish(topics.uplink(device), encode_envelope(Envelope.of(body, device, round=rnd)))


def register_all(peers: dict[str, MqttTransport], topics: Topics, fleet: Fleet) -> None:
    """Each of ``peers`` (device id -> its connection) registers as a Raspberry Pi 4B with 50
    samples; returns once ``fleet`` has them all online and each read the coordinator's ack."""
    time.sleep(0.2)  # the coordinator's subscriptions reach the broker
    for device, peer in peers.items():
        send_as(peer, topics, device, Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50), -1)
    assert sorted(fleet.wait_for_devices(len(peers), 5.0)) == sorted(peers)
    for peer in peers.values():
        incoming = peer.receive(5.0)
        assert incoming is not None, "no reply from the coordinator"
        assert isinstance(decode_envelope(incoming.payload).body, Ack)


@contextmanager
def registered_fleet(url: str, job: str, names: list[str], limits: FleetLimits = FleetLimits()
                     ) -> Iterator[tuple[Fleet, FedAvg, Topics, dict[str, MqttTransport]]]:
    """A coordinator's `Fleet` of a small FedAvg job on the broker at ``url`` and one raw device
    per name, registered; every connection closed afterwards."""
    topics = Topics(job=job)
    strategy = FedAvg(FederationConfig(seed=0), mlp(in_features=16, num_classes=3, hidden=(8,)))
    coordinator = MqttTransport(TransportConfig(url=url, client_id=f"{job}-coordinator"))
    coordinator.connect()
    fleet = Fleet(MessageLink(coordinator), topics, limits=limits,
                  on_register=lambda device: setattr(device, "label", strategy.assign(device)))
    fleet.start()
    peers = {d: raw_device(url, topics, d) for d in names}
    try:
        register_all(peers, topics, fleet)
        yield fleet, strategy, topics, peers
    finally:
        for peer in peers.values():
            peer.close()
        coordinator.close()
