"""A round's updates reach the strategy in the order of its participants, not of their arrival,
so that a seeded job sums them alike from run to run."""

from __future__ import annotations

import threading
import time

from edge_sdk.protocol.messages import Ack, Update, decode_envelope
from edge_sdk.networking.transport import MqttTransport
from tests.support.raw_devices import registered_fleet, send_as

JOB = "collect-order"




def _acked(transport: MqttTransport) -> None:
    incoming = transport.receive(5.0)
    assert incoming is not None, "no reply from the coordinator"
    assert isinstance(decode_envelope(incoming.payload).body, Ack)


def test_updates_come_in_participant_order_whatever_the_arrival(broker):
    names = ["zeta", "alpha", "mid"]
    with registered_fleet(broker.url, JOB, names) as (fleet, strategy, topics, peers):
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
