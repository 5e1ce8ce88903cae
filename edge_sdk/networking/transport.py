"""Small, thread-safe MQTT transport for edge devices (paho-mqtt 2.x).

paho's network thread runs our callbacks, which never block. Observed paho 2.2:

* qos >= 1 messages published while disconnected (after the first connect)
  are kept by paho and sent after the next CONNACK; unacknowledged in-flight
  ones are re-sent (DUP). qos 0 cannot be queued: publishing it while
  disconnected raises TransportError.
* After every (re)connect we resubscribe, then publish the configured birth
  message (a retained "online" that overrides the will the broker may have
  published while we were gone).
* Every connection has a stamp (`connection_stamp`, wall-clock nanoseconds,
  increasing). Will and birth may be built per connection from it, so a
  reader can tell an old connection's will, delivered late (a broker that
  publishes wills while shutting down, or on a session take-over), from the
  state of the current one.
* After a lost connection paho waits ``reconnect_min_delay``, doubling the
  wait after every failed attempt up to ``reconnect_max_delay``; it resets
  after a successful CONNACK.
* paho neither enforces the broker's Maximum Packet Size nor handles
  mosquitto's PUBACK 0x95 for oversize publishes, so publish() refuses them.
  Under 3.1.1 no limit is announced: set max_packet_size, or paho resends forever.
* Received messages wait in a `FairInbox` keyed by topic: a topic that floods
  fills (and loses) only its own share, and topics are served in turn.
* paho keeps every unacknowledged qos >= 1 publish and fails once its 65,535
  message ids are all in use ("Message queue full"), and holds every message
  not yet written in memory. publish() waits (backs off) while more than
  ``max_outgoing`` messages or ``max_outgoing_bytes`` are unacknowledged, as
  long as acknowledgements keep coming, and raises TransportError once none
  came for ``outgoing_wait_s``: it never lets paho fail.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from edge_sdk.networking.fair_inbox import FairInbox, InboxLimits
from edge_sdk.networking.network_loop import NetworkLoop

__all__ = ["IncomingMessage", "MqttTransport", "TransportConfig", "TransportError", "Will",
           "WillSource", "publish_packet_size"]

log = logging.getLogger(__name__)


class _BenignPahoNoise(logging.Filter):
    """paho's network thread logs "Client is not connected" at ERROR when it wakes
    once more after a clean DISCONNECT; that race is harmless, so it goes to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("Client is not connected"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_BENIGN_PAHO_NOISE = _BenignPahoNoise()


def _paho_logger() -> logging.Logger:
    """The logger paho's client logs to (its errors, e.g. socket resets on a broker restart),
    with `_BenignPahoNoise` on it: installed when a transport first hands it to paho, not at
    import (adding the same filter again is a no-op)."""
    logger = logging.getLogger(f"{__name__}.paho")
    logger.addFilter(_BENIGN_PAHO_NOISE)
    return logger

_QUEUED = (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN)
#: SO_LINGER on, 0 s: closing the socket resets the connection (`MqttTransport.abort`)
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


#: MQTT 5's reason code "Not authorized" (0x87)
_NOT_AUTHORIZED = 135


class TransportError(ConnectionError):
    """Connecting to or publishing through the broker failed."""


@dataclass(frozen=True)
class Will:
    """A fixed message: the last will (the broker publishes it if the client dies without
    DISCONNECT) or the birth message (published after every connect, see TransportConfig)."""
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


#: A fixed `Will`, or one built for each connection from the connection's stamp.
WillSource = Will | Callable[[int], Will]


def _resolve(source: WillSource | None, stamp: int) -> Will | None:
    return source(stamp) if callable(source) else source


@dataclass(frozen=True)
class TransportConfig:
    """Connection settings; ``url`` is mqtt[s]://[user:pass@]host[:port]. ``max_packet_size``
    is an optional client-side cap, applied with the broker's (3.1.1 brokers announce none)."""
    url: str = "mqtt://127.0.0.1:1883"
    client_id: str = ""
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_insecure: bool = False
    keepalive: int = 30
    protocol: str = "auto"
    will: WillSource | None = None
    #: Published after every successful connect (first and reconnects), after resubscribing:
    #: e.g. a retained "online" status that replaces the last will the broker may have sent.
    birth: WillSource | None = None
    connect_timeout: float = 10.0
    reconnect_min_delay: float = 0.5
    reconnect_max_delay: float = 10.0
    #: budgets of the receive queue (per topic and overall; see `FairInbox`)
    inbox: InboxLimits = field(default_factory=InboxLimits)
    max_packet_size: int | None = None
    #: unacknowledged publishes above which publish() waits for acknowledgements (paho fails at 65,535)
    max_outgoing: int = 20_000
    #: unacknowledged payload bytes above which publish() waits likewise: paho queues every message
    #: it has not written yet in memory (10,000 plans of 0.5 MB: 5 GB); one message larger than this
    #: is sent alone
    max_outgoing_bytes: int = 256 << 20
    #: how long publish() waits for room before it raises TransportError
    outgoing_wait_s: float = 30.0

    def __post_init__(self) -> None:
        self.endpoint()  # validates the URL
        if self.protocol not in ("auto", "5", "3.1.1"):
            raise ValueError(f"protocol must be 'auto', '5' or '3.1.1', not {self.protocol!r}")
        if self.connect_timeout <= 0 or self.keepalive < 0:
            raise ValueError("need connect_timeout > 0 and keepalive >= 0")
        if type(self.max_outgoing) is not int or not 1 <= self.max_outgoing <= 60_000 or not self.outgoing_wait_s >= 0:
            raise ValueError("need max_outgoing in [1, 60000] and outgoing_wait_s >= 0")
        if type(self.max_outgoing_bytes) is not int or self.max_outgoing_bytes < 1:
            raise ValueError(f"max_outgoing_bytes must be an integer >= 1, got {self.max_outgoing_bytes!r}")
        if not 0 < self.reconnect_min_delay <= self.reconnect_max_delay:
            raise ValueError("need 0 < reconnect_min_delay <= reconnect_max_delay")

    def endpoint(self) -> tuple[str, int, bool, str | None, str | None]:
        """(host, port, tls, username, password) parsed from ``url``."""
        parts = urlsplit(self.url)
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"bad port in broker url {self.url!r}") from exc
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(f"broker url must look like mqtt[s]://host[:port], not {self.url!r}")
        tls = parts.scheme == "mqtts"
        return (parts.hostname, port or (8883 if tls else 1883), tls,
                unquote(parts.username) if parts.username else None,
                unquote(parts.password) if parts.password else None)


@dataclass(frozen=True)
class IncomingMessage:
    """A message received on a subscribed topic."""
    topic: str
    payload: bytes
    retained: bool


def publish_packet_size(topic: str, payload_len: int, qos: int, v5: bool) -> int:
    """Total bytes of the PUBLISH packet paho sends (no v5 properties)."""
    remaining = 2 + len(topic.encode("utf-8")) + (2 if qos else 0) + (1 if v5 else 0) + payload_len
    return 1 + next(n for n in (1, 2, 3, 4, 5) if remaining < 128**n) + remaining


class MqttTransport:
    """MQTT client: blocking connect, non-blocking publish, queued receive."""

    def __init__(self, config: TransportConfig, network: NetworkLoop | None = None) -> None:
        self.config = config
        #: the loop that drives this connection's socket, shared with other connections (None: a
        #: network thread of its own, paho's `loop_start`); see edge_sdk/networking/network_loop.py
        self._network = network
        self._host, self._port, self._tls, url_user, url_pw = config.endpoint()
        self._username = config.username if config.username is not None else url_user
        self._password = config.password if config.password is not None else url_pw
        self._client_id = config.client_id or f"edgefl-{uuid.uuid4().hex[:16]}"
        self._inbox: FairInbox[IncomingMessage] = FairInbox(config.inbox)
        self._lock = threading.Lock()
        self._pub_cond = threading.Condition()
        self._pending: dict[int, mqtt.MQTTMessageInfo] = {}
        self._pending_sizes: dict[int, int] = {}  # payload bytes of each pending publish
        self._pending_topics: dict[int, str] = {}  # the topic of each pending publish
        #: why the broker will not let this client publish where it must (its ACL: "Not authorized"),
        #: the first time it said so; None while it has not
        self.not_authorized: str | None = None
        self._pending_bytes = 0
        self._acks = 0  # acknowledgements so far: a wait for room lasts while they keep coming
        self._early_acks: set[int] = set()
        self._subs: dict[str, int] = {}
        self._client: mqtt.Client | None = None
        self._attempt: mqtt.Client | None = None
        self._probe: mqtt.Client | None = None  # connects without will or birth
        self._first = threading.Event()
        self._first_failure: tuple[int | None, str] | None = None
        self._version = "3.1.1" if config.protocol == "3.1.1" else "5"
        self._connected = self._closed = False
        self._max_packet: int | None = None
        self._connect_count = self._failed = 0
        self._stamp = 0
        self._next_stamp()
        #: called (on the network thread; it must not block) when a message was queued or `wake`
        #: was called: how a host that drives many devices learns which one has work (None: nobody)
        self.on_ready: Callable[[], None] | None = None
        #: takes every incoming message instead of the receive queue (on the network thread; it
        #: must not block): a simulation's connection shared by many devices hands each its own
        #: (simulation/shared_connection.py). None: messages queue for `receive`
        self.route: Callable[[IncomingMessage], None] | None = None
        #: called (on the network thread; it must not block) after every successful CONNACK with
        #: the number of them so far (None: nobody)
        self.on_connected: Callable[[int], None] | None = None

    def _next_stamp(self) -> None:
        """A new connection stamp: wall-clock ns, strictly above the previous one."""
        self._stamp = max(time.time_ns(), self._stamp + 1)

    @property
    def connection_stamp(self) -> int:
        """The stamp of the current connection (of the next one while disconnected): the
        will and birth of that connection carry it (see `WillSource`)."""
        return self._stamp

    @property
    def connected(self) -> bool:
        """True between a successful CONNACK and the next disconnect."""
        return self._connected

    @property
    def protocol_version(self) -> str:
        """"5" or "3.1.1" (negotiated by connect(); before that, the first to try)."""
        return self._version

    @property
    def max_packet_size(self) -> int | None:
        """Maximum Packet Size announced in the last CONNACK (None if none)."""
        return self._max_packet

    @property
    def connect_count(self) -> int:
        """Successful CONNACKs so far (2+ means it reconnected)."""
        return self._connect_count

    @property
    def dropped(self) -> int:
        """Incoming messages dropped over the receive queue's budgets (all topics)."""
        return self._inbox.dropped

    def take_dropped(self) -> dict[str, int]:
        """Incoming messages dropped per topic since the last call (see `FairInbox`)."""
        return self._inbox.take_dropped()

    def set_topic_budget(self, topic: str | None, max_bytes: int | None) -> None:
        """Bytes that messages of ``topic`` may take in the receive queue (None: the default);
        ``topic`` None sets the default of every topic without its own."""
        self._inbox.set_budget(topic, max_bytes)

    def set_topic_rate(self, rate: float | None, burst: int) -> None:
        """Messages per second (up to ``burst``) each topic may queue; the rest are dropped and
        counted (`take_dropped`). ``rate`` None: unlimited (the default)."""
        self._inbox.set_rate(rate, burst)

    @property
    def outgoing(self) -> int:
        """Publishes handed to paho and not yet acknowledged."""
        with self._pub_cond:
            return len(self._pending)

    @property
    def failed(self) -> int:
        """Publishes refused by the broker (PUBACK reason >= 0x80) or lost (qos 0)."""
        return self._failed

    def max_payload(self, topic: str, qos: int = 1) -> int | None:
        """Largest payload publish() accepts for this topic, None if unlimited."""
        if (limit := self._limit()) is None:
            return None
        size = limit - publish_packet_size(topic, 0, qos, self._version == "5")
        while size > 0 and publish_packet_size(topic, size, qos, self._version == "5") > limit:
            size -= 1
        return max(size, 0)

    def connect(self) -> None:
        """Connect and block until the first successful CONNACK (or raise)."""
        with self._lock:
            if self._closed:
                raise TransportError("transport is closed")
            if self._client is not None:
                return
        deadline = time.monotonic() + self.config.connect_timeout
        versions = ("5", "3.1.1") if self.config.protocol == "auto" else (self.config.protocol,)
        # amqtt (3.1.1 only) cannot parse a v5 CONNECT carrying a will and never
        # answers it, so with a will "auto" first probes v5 without the will.
        probe = self.config.protocol == "auto" and self.config.will is not None
        for i, version in enumerate(versions):
            client = self._make_client(version, will=not (probe and version == "5"))
            failure = self._first_connect(client, version, deadline)
            if failure is None and probe and version == "5":  # v5 works: reconnect with the will
                self._discard(client)
                self._connect_count -= 1
                client = self._make_client(version)
                failure = self._first_connect(client, version, deadline)
            if failure is None:
                self._client = client
                # paho's own errors (socket resets on a broker restart) from here on; a failed
                # first connection is reported by the error below, with a hint
                client.enable_logger(_paho_logger())
                return
            self._discard(client)
            code, message = failure
            # 0x84 "Unsupported protocol version" (paho maps the v3 return code 1 to it)
            if i + 1 < len(versions) and (code == 0x84 or "before CONNACK" in message):
                log.info("broker refused MQTT %s (%s); trying %s", version, message, versions[i + 1])
                continue
            raise TransportError(f"cannot connect to {self._host}:{self._port} with MQTT {version}: "
                                 f"{message}{self._scheme_hint(message)}")

    def _scheme_hint(self, message: str) -> str:
        """A hint when a plain client dialled a TLS port or a TLS client a plain one."""
        where = f"{self._host}:{self._port}"
        if not self._tls and "before CONNACK" in message:
            return f"; if {where} is a TLS listener, use mqtts://{where} (and its CA file)"
        lowered = message.lower()
        if self._tls and ("wrong version number" in lowered or "wrong_version_number" in lowered
                          or "connection reset" in lowered):
            return f"; if {where} is a plain (non-TLS) listener, use mqtt://{where}"
        return ""

    def _make_client(self, version: str, will: bool = True) -> mqtt.Client:
        cfg = self.config
        kwargs: dict[str, object] = ({"protocol": mqtt.MQTTv5} if version == "5"
                                     else {"protocol": mqtt.MQTTv311, "clean_session": True})
        client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                             client_id=self._client_id, **kwargs)  # type: ignore[arg-type]
        client.suppress_exceptions = True  # a callback bug must not kill the network thread
        if self._username is not None:
            client.username_pw_set(self._username, self._password)
        if self._tls:
            client.tls_set(ca_certs=cfg.ca_file, certfile=cfg.cert_file, keyfile=cfg.key_file)
            if cfg.tls_insecure:
                client.tls_insecure_set(True)
        if cfg.will is not None and will:
            self._set_will(client)
        if not will:
            self._probe = client
        client.reconnect_delay_set(cfg.reconnect_min_delay, cfg.reconnect_max_delay)  # type: ignore[arg-type]
        client.on_connect, client.on_disconnect = self._on_connect, self._on_disconnect
        client.on_message, client.on_publish = self._on_message, self._on_publish
        return client

    def _set_will(self, client: mqtt.Client) -> None:
        """The will of the connection `connection_stamp` names (sent in its CONNECT)."""
        if (w := _resolve(self.config.will, self._stamp)) is not None:
            client.will_set(w.topic, bytes(w.payload), w.qos, w.retain)

    def _first_connect(self, client: mqtt.Client, version: str,
                       deadline: float) -> tuple[int | None, str] | None:
        """Open the socket (retrying until deadline), start the loop, await CONNACK."""
        self._version = version
        self._first.clear()
        self._first_failure, self._attempt = None, client
        delay, last_error = self.config.reconnect_min_delay, "no attempt"
        client.connect_timeout = max(0.1, deadline - time.monotonic())
        if self._network is not None:  # before connect: the socket it opens is registered with the loop
            self._network.attach(client, self.config.reconnect_min_delay, self.config.reconnect_max_delay)
        while True:
            if time.monotonic() >= deadline:
                return (None, f"broker unreachable within {self.config.connect_timeout:g} s ({last_error})")
            try:
                extra = {"clean_start": True} if version == "5" else {}
                client.connect(self._host, self._port, self.config.keepalive, **extra)  # type: ignore[arg-type]
                break
            except ssl.SSLError as exc:
                return (None, f"TLS handshake failed: {exc}")
            except (OSError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, self.config.reconnect_max_delay)
        if self._network is None:
            client.loop_start()
        if not self._first.wait(max(0.0, deadline - time.monotonic())):
            return (None, f"no CONNACK within {self.config.connect_timeout:g} s")
        return self._first_failure

    def _discard(self, client: mqtt.Client, clean: bool = True) -> None:
        """Stop a client: DISCONNECT (clean) or just drop the TCP connection."""
        self._attempt, self._connected = None, False
        client.reconnect_delay_set(3600, 3600)  # type: ignore[arg-type]
        if clean:
            if self._network is not None:  # the shared loop forgets it once its socket has closed
                self._network.detach(client)
            client.disconnect()
        else:
            client.disable_logger()  # the loop may still read the socket once: its "broken pipe" is ours
            sock = client.socket()
            if sock is not None:
                # reset, not closed: no TIME_WAIT left on either side (thousands of them, after a
                # simulated fleet ends, slow every later connection's port search)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            if self._network is not None:
                self._network.reset(client)  # closed by the loop's thread, the next time round
            elif sock is not None:  # paho's thread reads the end of the stream and closes the socket
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)
        if self._network is None:
            client.loop_stop()

    # paho callbacks: run on the network thread, must never block
    def _on_connect(self, client: mqtt.Client, _ud: object, _flags: object,
                    reason: object, properties: object) -> None:
        if client is not self._attempt:
            return
        if getattr(reason, "is_failure", False):
            log.info("broker refused connection: %s", reason)
            if not self._first.is_set():
                code = int(getattr(reason, "value", 0))
                hint = " (check username/password and ACL)" if code in (0x86, 0x87, 0x8C) else ""
                self._first_failure = (code, f"{reason}{hint}")
                client.disconnect()  # no reconnect attempts (and no delay) before discard
                self._first.set()
            return
        self._max_packet = getattr(properties, "MaximumPacketSize", None)
        with self._lock:
            subs = list(self._subs.items())
            self._connected = True
            self._connect_count += 1
        if subs:  # one SUBSCRIBE for all of them: one SUBACK to wait for and parse
            client.subscribe(subs)
        if (birth := _resolve(self.config.birth, self._stamp)) is not None and client is not self._probe:
            client.publish(birth.topic, bytes(birth.payload), birth.qos, birth.retain)
        if self.on_connected is not None and client is not self._probe:
            self.on_connected(self._connect_count)
        self._first.set()

    def _on_disconnect(self, client: mqtt.Client, _ud: object, _flags: object,
                       reason: object, _props: object) -> None:
        if client is not self._attempt:
            return
        self._connected = False
        log.info("disconnected from broker: %s", reason)
        if self._first.is_set():  # the next connection: paho's reconnect sends its will in the CONNECT
            self._next_stamp()
            self._set_will(client)
        if not self._first.is_set():
            self._first_failure = (None, f"connection closed before CONNACK ({reason})")
            client.disconnect()
            self._first.set()

    def _on_message(self, _client: mqtt.Client, _ud: object, msg: mqtt.MQTTMessage) -> None:
        try:
            topic = msg.topic
        except UnicodeDecodeError as exc:  # a topic that is not UTF-8: drop it
            log.warning("dropping a message with an undecodable topic: %r", exc)
            return
        payload = bytes(msg.payload)
        if self.route is not None:
            self.route(IncomingMessage(topic, payload, bool(msg.retain)))
            return
        if self._inbox.put(topic, IncomingMessage(topic, payload, bool(msg.retain)), len(payload)) and self.on_ready:
            self.on_ready()

    def _on_publish(self, _client: mqtt.Client, _ud: object, mid: int,
                    reason: object, _props: object) -> None:
        # never call paho while holding _pub_cond: paho holds its own lock here
        with self._pub_cond:
            topic = self._pending_topics.pop(mid, None)
            if getattr(reason, "is_failure", False):
                self._failed += 1
                self._refused(topic, reason)
            self._acks += 1
            if self._pending.pop(mid, None) is None:
                self._early_acks.add(mid)
            self._pending_bytes -= self._pending_sizes.pop(mid, 0)
            self._pub_cond.notify_all()

    def _refused(self, topic: str | None, reason: object) -> None:
        """A publish the broker refused: said once per kind; "Not authorized" is kept in
        :attr:`not_authorized` (retrying cannot help: its ACL does not let this user write there)."""
        where = f"to {topic!r}" if topic else "(its topic was not recorded)"
        if getattr(reason, "value", None) == _NOT_AUTHORIZED:
            if self.not_authorized is None:
                self.not_authorized = (f"the broker refused a publish {where}: Not authorized (its ACL does not "
                                       f"let user {self._username!r} write there; a device's device_id must be "
                                       f"its MQTT username)")
                log.error("%s", self.not_authorized)
            return
        if self._failed <= 3:
            log.warning("broker refused publish %s: %s", where, reason)

    def subscribe(self, topic: str, qos: int = 1) -> None:
        """Subscribe now if connected; always re-subscribed after reconnects."""
        self.subscribe_many([(topic, qos)])

    def subscribe_many(self, topics: list[tuple[str, int]]) -> None:
        """Subscribe to several (topic, qos) at once (one SUBSCRIBE) if connected; always
        re-subscribed after reconnects."""
        for topic, qos in topics:
            if qos not in (0, 1, 2) or not topic:
                raise ValueError(f"invalid subscription {topic!r} with qos {qos!r}")
        if not topics:
            return
        with self._lock:
            self._subs.update(topics)
            client = self._client if self._connected else None
        if client is not None and (rc := client.subscribe(list(topics))[0]) not in _QUEUED:
            names = ", ".join(repr(t) for t, _ in topics)
            raise TransportError(f"subscribe to {names} failed: {mqtt.error_string(rc)}")

    def _limit(self) -> int | None:
        return min((x for x in (self._max_packet, self.config.max_packet_size) if x), default=None)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Hand a message to paho (non-blocking); see wait_published()."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        if qos not in (0, 1, 2) or not topic or "+" in topic or "#" in topic:
            raise ValueError(f"invalid publish topic {topic!r} or qos {qos!r}")
        data = bytes(payload)
        if (client := self._client) is None:
            raise TransportError("transport is closed" if self._closed else "not connected: call connect() first")
        size = publish_packet_size(topic, len(data), qos, self._version == "5")
        if (limit := self._limit()) is not None and size > limit:
            who = "broker's" if limit == self._max_packet else "configured"
            raise TransportError(f"payload of {len(data)} bytes exceeds the {who} maximum packet "
                                 f"size {limit} (packet would be {size} bytes)")
        if qos and not self._room_to_publish(len(data)):
            raise TransportError(f"publish to {topic!r} not sent: {len(self._pending)} earlier messages "
                                 f"({self._pending_bytes:,} bytes) are still unacknowledged, none for "
                                 f"{self.config.outgoing_wait_s:g} s")
        info = client.publish(topic, data, qos=qos, retain=retain)
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos == 0:
            raise TransportError("not connected: qos 0 message dropped")
        if info.rc not in _QUEUED:
            raise TransportError(f"publish to {topic!r} failed: {mqtt.error_string(info.rc)}")
        with self._pub_cond:  # the PUBACK may have raced ahead of us (see _on_publish)
            if info.mid in self._early_acks:
                self._early_acks.discard(info.mid)
            else:
                self._pending[info.mid] = info
                self._pending_topics[info.mid] = topic
                if qos:  # what waits for its PUBACK counts against max_outgoing_bytes
                    self._pending_sizes[info.mid] = len(data)
                    self._pending_bytes += len(data)

    def _room_to_publish(self, size: int) -> bool:
        """Wait until fewer than ``max_outgoing`` publishes, and with ``size`` more no more than
        ``max_outgoing_bytes``, are unacknowledged (or none is: a larger message goes alone);
        False once no acknowledgement came for ``outgoing_wait_s`` (the broker or the link stalled,
        not merely slow)."""
        config = self.config
        with self._pub_cond:
            seen, deadline = self._acks, time.monotonic() + config.outgoing_wait_s
            while len(self._pending) >= config.max_outgoing or (
                    self._pending_bytes and self._pending_bytes + size > config.max_outgoing_bytes):
                if self._acks != seen:  # progress: wait on
                    seen, deadline = self._acks, time.monotonic() + config.outgoing_wait_s
                if (remaining := deadline - time.monotonic()) <= 0:
                    return False
                self._pub_cond.wait(min(remaining, 0.5))
        return True

    def wait_published(self, timeout: float) -> bool:
        """True once every publish so far is acknowledged (qos 0: written)."""
        deadline = time.monotonic() + timeout
        swept = -math.inf
        with self._pub_cond:
            while True:
                if time.monotonic() - swept >= 0.5:  # not on every PUBACK: thousands pending made it quadratic
                    swept = time.monotonic()
                    for mid, info in list(self._pending.items()):
                        if info.rc == MQTTErrorCode.MQTT_ERR_CONN_LOST:  # qos 0 lost with the socket
                            del self._pending[mid]
                            self._pending_topics.pop(mid, None)
                            self._pending_bytes -= self._pending_sizes.pop(mid, 0)
                            self._failed += 1
                if not self._pending:
                    return True
                if (remaining := deadline - time.monotonic()) <= 0:
                    return False
                self._pub_cond.wait(min(remaining, 0.5))

    def receive(self, timeout: float | None = None) -> IncomingMessage | None:
        """Next incoming message (topics in turn), or None on timeout (or after close() or wake())."""
        return self._inbox.get(timeout=timeout)

    def wake(self) -> None:
        """Make a `receive` that is waiting return now (None when nothing came)."""
        self._inbox.wake()
        if self.on_ready is not None:
            self.on_ready()

    def close(self, _clean: bool = True) -> None:
        """Clean DISCONNECT (the will is not published) and stop the loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            self._discard(client, clean=_clean)
        self._inbox.close()  # wakes a receive(None) blocked in another thread

    def abort(self) -> None:
        """Drop the TCP connection without DISCONNECT, as a device that loses power does (the
        broker publishes the will), and stop."""
        self.close(_clean=False)

    def _simulate_crash(self) -> None:
        """Test hook: `abort`."""
        self.abort()

    def __enter__(self) -> "MqttTransport":
        self.connect()  # no-op when already connected
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
