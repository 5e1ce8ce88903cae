"""A device's MQTT connection: its will and birth message (its retained status, stamped with the
connection), its subscriptions, and a first connect retried for `ClientConfig.connect_retry_s`."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable

from edge_sdk.device.client_config import ClientConfig
from edge_sdk.protocol.messages import Envelope, Status, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.device.sim_hooks import SimHooks
from edge_sdk.networking.transport import MqttTransport, TransportError, Will

__all__ = ["open_connection", "presence"]

log = logging.getLogger("edge_sdk.client")  # the device's log, whichever part of it speaks


def presence(topics: Topics, device_id: str, state: str, reason: str) -> Callable[[int], Will]:
    """The retained status `state` of one connection (its will or its birth message),
    stamped with that connection, so the coordinator can tell a late will of an old
    connection from news about the current one."""
    topic = topics.status(device_id)

    def build(stamp: int) -> Will:
        env = Envelope.of(Status(state, reason, connection=stamp), device_id)
        return Will(topic, encode_envelope(env), qos=1, retain=True)
    return build


def open_connection(config: ClientConfig, topics: Topics, sim: SimHooks, stop: threading.Event) -> MqttTransport:
    """The device's connection (its own, or the one ``sim.connect_via`` builds), subscribed to
    its downlink and the job's broadcasts and connected: blocking until the first CONNACK,
    retrying for ``connect_retry_s`` unless ``stop`` is set."""
    device_id = config.device_id
    transport_config = replace(
        config.transport,
        client_id=config.transport.client_id or device_id,
        will=presence(topics, device_id, "offline", "connection lost"),
        birth=presence(topics, device_id, "online", "connected"),  # after every reconnect too
    )
    transport = (MqttTransport(transport_config, network=sim.network) if sim.connect_via is None
                 else sim.connect_via(transport_config))
    transport.on_ready = sim.on_ready
    # subscribed on connect, before the birth message: what answers it reaches us
    transport.subscribe(topics.downlink(device_id))
    transport.subscribe(topics.broadcast())
    try:
        _connect(transport, device_id, config.connect_retry_s, stop)
    except BaseException:
        transport.close()
        raise
    return transport


def _connect(transport: MqttTransport, device_id: str, retry_s: float, stop: threading.Event) -> None:
    give_up = time.monotonic() + retry_s
    pause = 0.5
    while True:
        try:
            return transport.connect()
        except TransportError as exc:
            if stop.is_set() or time.monotonic() + pause > give_up:
                raise
            log.info("%s: %s; retrying in %.1f s", device_id, exc, pause)
            stop.wait(pause)
            pause = min(2 * pause, 5.0)
