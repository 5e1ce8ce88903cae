"""Subscribe a test's MQTT client and wait until the broker applied it: ``subscribe`` returns before
the broker's SUBACK, and a message another client publishes meanwhile is not delivered (a device's
first Register, then retried only 30 s later: a CI run waited 5 s for it)."""

from __future__ import annotations

from edge_sdk.networking.transport import MqttTransport

__all__ = ["subscribed"]


def subscribed(transport: MqttTransport, *topics: str) -> None:
    """Subscribe ``transport`` to ``topics``, then publish a probe on the last one (its wildcards as
    ``probe``) until it comes back: the broker takes one client's packets in order, so every
    subscription is applied by then. The duplicate probes are drained."""
    for topic in topics:
        transport.subscribe(topic)
    probe = topics[-1].replace("#", "probe").replace("+", "probe")
    for _ in range(50):
        transport.publish(probe, b"probe")
        msg = transport.receive(0.1)
        if msg is not None and msg.payload == b"probe":
            while transport.receive(0.05) is not None:  # drain duplicate probes
                pass
            return
    raise AssertionError(f"subscription to {', '.join(topics)} never became active")
