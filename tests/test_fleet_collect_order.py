"""A round's updates reach the strategy in the order of its participants, not of their arrival,
so that a seeded job sums them alike from run to run."""

from __future__ import annotations

import threading
import time

from coordinator.runtime.fleet import Fleet
from coordinator.strategies.fedavg import FedAvg
from coordinator.runtime.federation import FederationConfig
from edge_sdk.link import MessageLink
from edge_sdk.models.zoo import mlp
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Register, Update, decode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.transport import MqttTransport, TransportConfig
from tests.raw_devices import raw_device, send_as

JOB = "collect-order"




def _acked(transport: MqttTransport) -> None:
    incoming = transport.receive(5.0)
    assert incoming is not None, "no reply from the coordinator"
    assert isinstance(decode_envelope(incoming.payload).body, Ack)


def test_updates_come_in_participant_order_whatever_the_arrival(broker):
    topics = Topics(job=JOB)
    strategy = FedAvg(FederationConfig(seed=0), mlp(in_features=16, num_classes=3, hidden=(8,)))
    coordinator = MqttTransport(TransportConfig(url=broker.url, client_id="collect-order-coordinator"))
    coordinator.connect()
    fleet = Fleet(MessageLink(coordinator), topics, on_register=lambda device: setattr(device, "label", strategy.assign(device)))
    fleet.start()
    names = ["zeta", "alpha", "mid"]
    peers = {d: raw_device(broker.url, topics, d) for d in names}
    try:
        time.sleep(0.2)
        for d, peer in peers.items():
            send_as(peer, topics, d, Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50), -1)
        assert sorted(fleet.wait_for_devices(3, 5.0)) == sorted(names)
        for peer in peers.values():
            _acked(peer)
        result: dict = {}
        collector = threading.Thread(
            target=lambda: result.update(fleet.collect(0, names, 20.0, strategy.check_update).updates))
        collector.start()
        time.sleep(0.2)
        for d in ("mid", "alpha", "zeta"):  # arrival order: neither the participants' nor sorted
            send_as(peers[d], topics, d, Update("global", dict(strategy.weights), 10, {}), 0)
            _acked(peers[d])
        collector.join(timeout=20)
        assert list(result) == names
    finally:
        for peer in peers.values():
            peer.close()
        coordinator.close()
