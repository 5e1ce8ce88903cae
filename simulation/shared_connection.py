"""One MQTT connection that carries the messages of many simulated devices (`--connections
shared`): each device publishes and subscribes on its own topics, exactly as over a connection of
its own, so the coordinator sees the same messages on the same topics and validates them the same
way; only the TCP connection, its CONNECT and its keep-alives are shared.

A device's presence is kept by the host instead of the broker: its birth message ("online") is
published when it joins, and its will ("offline", "connection lost") when it is aborted — what
the broker does for a device with a connection of its own. A host that dies without a word leaves
its devices "online" (retained) until the coordinator's own checks find them gone. On a job's own
embedded broker, which stops with it, neither is published: the coordinator learns of a device from
its registration (it ignores a birth that comes before it) and nobody reads a will after the job.
docs/simulation.md says what this mimics and what it does not.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from edge_sdk.networking.fair_inbox import FairInbox
from edge_sdk.networking.network_loop import NetworkLoop
from edge_sdk.networking.transport import IncomingMessage, MqttTransport, TransportConfig, TransportError, WillSource

__all__ = ["SharedConnection", "DeviceChannel", "CONNECTIONS", "OWN_CONNECTIONS_UP_TO"]

log = logging.getLogger(__name__)

#: How simulated devices reach the broker (`--connections`): each over a connection of its own,
#: the devices of one process over one shared connection, or "auto": their own up to
#: `OWN_CONNECTIONS_UP_TO` devices, shared past that.
CONNECTIONS = ("auto", "own", "shared")
OWN_CONNECTIONS_UP_TO = 1_000


def _will(source: WillSource | None, stamp: int) -> tuple[str, bytes, int, bool] | None:
    if source is None:
        return None
    will = source(stamp) if callable(source) else source
    return will.topic, bytes(will.payload), will.qos, will.retain


class SharedConnection:
    """The connection of one host's devices: routes every incoming message to the channels
    subscribed to its topic (a device's own topics go to it, the fleet's broadcast to all)."""

    def __init__(self, config: TransportConfig, network: NetworkLoop | None = None, presence: bool = True) -> None:
        #: whether the devices' births and wills are published. False: the broker is the job's own
        #: and stops with it — nobody reads a will after the job, and the coordinator learns of a
        #: device from its registration (a birth before it is ignored; half the start-up's messages)
        self.presence = presence
        # room for every device's unacknowledged messages (a device's birth, registration, will)
        self.transport = MqttTransport(replace(config, will=None, birth=None, max_outgoing=60_000), network=network)
        self.transport.route = self._route
        self.transport.on_connected = self._reconnected
        self._routes: dict[str, list[DeviceChannel]] = {}
        self._channels: set[DeviceChannel] = set()
        self._lock = threading.Lock()
        self._stamps = itertools.count(time.time_ns())

    def connect(self) -> None:
        """Connect (blocking until the CONNACK); the devices join it afterwards."""
        self.transport.connect()

    def channel(self, config: TransportConfig) -> "DeviceChannel":
        """A device's view of the connection (its will and birth messages from ``config``); it
        joins with its `DeviceChannel.connect`."""
        return DeviceChannel(self, config)

    def next_stamp(self) -> int:
        """A connection stamp no channel of this connection had before."""
        return next(self._stamps)

    def join(self, channel: "DeviceChannel", topics: list[tuple[str, int]]) -> None:
        """Route ``topics`` to ``channel`` and subscribe to them (one SUBSCRIBE)."""
        if not self.transport.connected:
            raise TransportError("the shared connection is not connected")
        with self._lock:
            for topic, _ in topics:  # appended to: `_route` may be reading the list on the network thread
                self._routes.setdefault(topic, []).append(channel)
            self._channels.add(channel)
        self.transport.subscribe_many(topics)

    def leave(self, channel: "DeviceChannel") -> None:
        """No more reconnects for ``channel``; its routes stay (a closed channel takes no message),
        as do its subscriptions: a device leaves when the job ends."""
        with self._lock:
            self._channels.discard(channel)

    def close(self) -> None:
        """Reset the connection (its devices' wills were published by `DeviceChannel.abort`)."""
        self.transport.abort()

    def _route(self, message: IncomingMessage) -> None:
        for channel in self._routes.get(message.topic, ()):  # only ever appended to: no lock
            channel.deliver(message)

    def _reconnected(self, count: int) -> None:
        """After a reconnect (the broker restarted), every joined device says "online" again, with
        a new stamp, as its own connection's birth message would (on the network thread: no waiting)."""
        if count < 2:
            return
        with self._lock:
            channels = list(self._channels)
        for channel in channels:
            channel.reborn()


class DeviceChannel:
    """A device's connection, as far as its `MessageLink` and `DeviceClient` can tell: publish,
    subscribe, a receive queue of its own (with its own budgets), a connection stamp, a will and a
    birth message; carried by a `SharedConnection`."""

    def __init__(self, shared: SharedConnection, config: TransportConfig) -> None:
        self.config = config
        self._shared = shared
        self._inbox: FairInbox[IncomingMessage] = FairInbox(config.inbox)
        self._subs: dict[str, int] = {}
        self._stamp = shared.next_stamp()
        self._joined = self._closed = False
        self.on_ready: Callable[[], None] | None = None

    # -- what a device reads of its connection ------------------------------------------
    @property
    def topics(self) -> list[str]:
        return list(self._subs)

    @property
    def connection_stamp(self) -> int:
        return self._stamp

    @property
    def connected(self) -> bool:
        return self._joined and not self._closed and self._shared.transport.connected

    @property
    def protocol_version(self) -> str:
        return self._shared.transport.protocol_version

    @property
    def max_packet_size(self) -> int | None:
        return self._shared.transport.max_packet_size

    @property
    def connect_count(self) -> int:
        return 1 if self._joined else 0

    @property
    def dropped(self) -> int:
        return self._inbox.dropped

    def take_dropped(self) -> dict[str, int]:
        return self._inbox.take_dropped()

    @property
    def outgoing(self) -> int:
        return self._shared.transport.outgoing

    @property
    def failed(self) -> int:
        return self._shared.transport.failed

    def max_payload(self, topic: str, qos: int = 1) -> int | None:
        return self._shared.transport.max_payload(topic, qos)

    def set_topic_budget(self, topic: str | None, max_bytes: int | None) -> None:
        """As `MqttTransport.set_topic_budget`, for this device's receive queue."""
        self._inbox.set_budget(topic, max_bytes)

    def set_topic_rate(self, rate: float | None, burst: int) -> None:
        self._inbox.set_rate(rate, burst)

    # -- connecting ------------------------------------------------------------------------
    def connect(self) -> None:
        """Join the shared connection: subscribe to this device's topics, then say "online" (its
        birth message), in that order, as a connection of its own does."""
        if self._closed:
            raise TransportError("transport is closed")
        if self._joined:
            return
        self._shared.join(self, list(self._subs.items()))
        self._joined = True
        if self._shared.presence:
            self._publish_will(self.config.birth)

    def subscribe(self, topic: str, qos: int = 1) -> None:
        if qos not in (0, 1, 2) or not topic:
            raise ValueError(f"invalid subscription {topic!r} with qos {qos!r}")
        if self._joined:
            raise TransportError("a device on a shared connection subscribes before it connects")
        self._subs[topic] = qos

    def reborn(self) -> None:
        """The shared connection reconnected: a new stamp and the birth message again."""
        if self._joined and not self._closed:
            self._stamp = self._shared.next_stamp()
            if self._shared.presence:
                self._publish_will(self.config.birth)

    # -- messages --------------------------------------------------------------------------
    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if self._closed:
            raise TransportError("transport is closed")
        if not self._joined:
            raise TransportError("not connected: call connect() first")
        self._shared.transport.publish(topic, payload, qos, retain)

    def wait_published(self, timeout: float) -> bool:
        """True once every publish of the shared connection so far is acknowledged (this
        device's among them)."""
        return self._shared.transport.wait_published(timeout)

    def deliver(self, message: IncomingMessage) -> None:
        """A message on one of this device's topics (on the network thread: no waiting)."""
        if self._inbox.put(message.topic, message, len(message.payload)) and self.on_ready is not None:
            self.on_ready()

    def receive(self, timeout: float | None = None) -> IncomingMessage | None:
        return self._inbox.get(timeout=timeout)

    def wake(self) -> None:
        self._inbox.wake()
        if self.on_ready is not None:
            self.on_ready()

    # -- ending ----------------------------------------------------------------------------
    def close(self, _clean: bool = True) -> None:
        """Leave the shared connection; not ``_clean`` (`abort`): its will is published, as the
        broker publishes a lost connection's."""
        if self._closed:
            return
        self._closed = True
        if self._joined:
            self._shared.leave(self)
            if not _clean and self._shared.presence:
                try:
                    self._publish_will(self.config.will)
                except TransportError as exc:  # the shared connection is gone too: nothing to say it on
                    log.debug("%s: will not published: %s", self.config.client_id, exc)
        self._inbox.close()

    def abort(self) -> None:
        """As a device that loses power: no more messages, and its will published."""
        self.close(_clean=False)

    def _simulate_crash(self) -> None:
        self.abort()

    def _publish_will(self, source: WillSource | None) -> None:
        if (will := _will(source, self._stamp)) is not None:
            topic, payload, qos, retain = will
            self._shared.transport.publish(topic, payload, qos, retain)
