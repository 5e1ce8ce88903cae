"""MqttTransport against real brokers (mosquitto and amqtt), no mocks."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import pytest

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker, free_port
from edge_sdk.networking.fair_inbox import InboxLimits
from edge_sdk.networking.transport import IncomingMessage, MqttTransport, TransportConfig, TransportError, Will
from tests.support.faultproxy import FaultProxy
from tests.support.requirements import needs, require
from tests.support.subscriptions import subscribed

needs_mosquitto = needs("mosquitto")


def _transport(url: str, **kw: object) -> MqttTransport:
    t = MqttTransport(TransportConfig(url=url, connect_timeout=5.0, **kw))  # type: ignore[arg-type]
    t.connect()
    return t


def _wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_config_validation_and_url_parsing() -> None:
    with pytest.raises(ValueError, match=r"mqtt\[s\]://"):
        TransportConfig(url="http://127.0.0.1:1883")
    with pytest.raises(ValueError, match="protocol"):
        TransportConfig(protocol="4")
    with pytest.raises(ValueError, match="max_outgoing"):
        TransportConfig(max_outgoing=0)
    for bad in (0, 1.5e8, "256M"):
        with pytest.raises(ValueError, match="max_outgoing_bytes must be an integer >= 1"):
            TransportConfig(max_outgoing_bytes=bad)
    assert TransportConfig(url="mqtts://broker.local").endpoint()[:3] == ("broker.local", 8883, True)
    assert TransportConfig(url="mqtt://u%40x:p%3A1@h").endpoint() == ("h", 1883, False, "u@x", "p:1")


def test_publish_before_connect_and_after_close() -> None:
    t = MqttTransport(TransportConfig(url=f"mqtt://127.0.0.1:{free_port()}"))
    with pytest.raises(TransportError, match="not connected"):
        t.publish("a/b", b"x")
    t.close()
    t.close()  # idempotent
    assert t.receive(0.1) is None
    with pytest.raises(TransportError, match="closed"):
        t.connect()


def test_unreachable_broker_times_out_with_reason() -> None:
    t = MqttTransport(TransportConfig(url=f"mqtt://127.0.0.1:{free_port()}", connect_timeout=0.6))
    start = time.monotonic()
    with pytest.raises(TransportError, match="unreachable.*ConnectionRefused"):
        t.connect()
    assert time.monotonic() - start < 3
    assert not t.connected and t.connect_count == 0


@needs_mosquitto
def test_roundtrip_mosquitto_v5(mosquitto_broker: EmbeddedBroker, topic_prefix: str) -> None:
    with _transport(mosquitto_broker.url) as t:
        assert t.connected and t.protocol_version == "5" and t.connect_count == 1
        assert t.max_packet_size == mosquitto_broker.config.max_packet_size
        subscribed(t, f"{topic_prefix}/#")
        t.publish(f"{topic_prefix}/x", b"\x00hello\xff")
        assert t.wait_published(5)
        msg = t.receive(5)
        assert msg == IncomingMessage(f"{topic_prefix}/x", b"\x00hello\xff", False)
        with pytest.raises(TypeError):
            t.publish(f"{topic_prefix}/x", "text")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            t.publish(f"{topic_prefix}/#", b"x")
    assert not t.connected


def test_auto_falls_back_to_311_on_amqtt(amqtt_broker: EmbeddedBroker, topic_prefix: str) -> None:
    with _transport(amqtt_broker.url) as t:
        assert t.protocol_version == "3.1.1" and t.max_packet_size is None
        assert t.connect_count == 1
        subscribed(t, f"{topic_prefix}/+")
        t.publish(f"{topic_prefix}/y", b"ok", retain=False)
        msg = t.receive(5)
        assert msg is not None and (msg.topic, msg.payload) == (f"{topic_prefix}/y", b"ok")


def test_forced_v5_on_amqtt_is_refused(amqtt_broker: EmbeddedBroker) -> None:
    t = MqttTransport(TransportConfig(url=amqtt_broker.url, protocol="5", connect_timeout=3))
    with pytest.raises(TransportError, match="(?i)unsupported protocol version"):
        t.connect()
    t.close()


def test_4mb_payload_through_amqtt(amqtt_broker: EmbeddedBroker, topic_prefix: str) -> None:
    payload = os.urandom(4 * 2**20)
    with _transport(amqtt_broker.url) as t:
        subscribed(t, f"{topic_prefix}/big")
        t.publish(f"{topic_prefix}/big", payload)
        assert t.wait_published(10)
        msg = t.receive(10)
        assert msg is not None and msg.payload == payload


def test_configured_packet_cap_applies_without_broker_limit(amqtt_broker: EmbeddedBroker) -> None:
    with _transport(amqtt_broker.url, max_packet_size=1000) as t:
        assert t.max_packet_size is None
        with pytest.raises(TransportError, match="configured maximum packet size 1000"):
            t.publish("cap/x", b"x" * 1000)
        assert t.max_payload("cap/x") == 988  # 1000 - fixed header 3 - topic 7 - packet id 2
        t.publish("cap/x", b"x" * 988)
        assert t.wait_published(5)


@needs_mosquitto
def test_oversize_publish_refused_and_transport_stays_usable(topic_prefix: str) -> None:
    limit = 65536
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto", max_packet_size=limit)) as b, \
            _transport(b.url) as t:
        assert t.max_packet_size == limit
        topic = f"{topic_prefix}/blob"
        subscribed(t, topic)
        with pytest.raises(TransportError, match=f"payload of {limit} bytes exceeds the broker's "
                                                 f"maximum packet size {limit}"):
            t.publish(topic, b"x" * limit)
        largest = t.max_payload(topic)
        assert largest is not None and limit - 64 < largest < limit
        with pytest.raises(TransportError):
            t.publish(topic, b"x" * (largest + 1))
        t.publish(topic, b"y" * largest)  # exactly at the limit: accepted by mosquitto
        assert t.wait_published(5)
        msg = t.receive(5)
        assert msg is not None and len(msg.payload) == largest
        t.publish(topic, b"small")
        assert t.wait_published(5) and t.connected and t.connect_count == 1
        msg = t.receive(5)
        assert msg is not None and msg.payload == b"small"
        assert t.failed == 0


@pytest.mark.parametrize("kind", ["mosquitto", "amqtt"])
def test_last_will_on_crash_not_on_clean_close(
        kind: str, request: pytest.FixtureRequest, topic_prefix: str) -> None:
    if kind == "mosquitto":
        require("mosquitto")
    b: EmbeddedBroker = request.getfixturevalue(f"{kind}_broker")
    crash_topic, clean_topic = f"{topic_prefix}/crash/status", f"{topic_prefix}/clean/status"
    with _transport(b.url) as observer:
        subscribed(observer, f"{topic_prefix}/+/status")
        crasher = _transport(b.url, will=Will(crash_topic, b"offline"))
        closer = _transport(b.url, will=Will(clean_topic, b"offline"))
        closer.close()
        crasher._simulate_crash()
        msg = observer.receive(5)
        assert msg is not None and (msg.topic, msg.payload) == (crash_topic, b"offline")
        time.sleep(0.2)
        assert observer.receive(0.2) is None  # the clean close sent no will
    with _transport(b.url) as late:  # the will was retained, the clean one never existed
        late.subscribe(f"{topic_prefix}/+/status")
        got = [late.receive(5)]
        while (extra := late.receive(0.3)) is not None:
            got.append(extra)  # amqtt 0.12 sends retained messages twice to wildcard filters
        assert set(got) == {IncomingMessage(crash_topic, b"offline", True)}


def test_reconnect_resubscribe_and_queue_while_disconnected(topic_prefix: str) -> None:
    with EmbeddedBroker() as b:
        sub = _transport(b.url, reconnect_min_delay=0.1, reconnect_max_delay=0.5)
        pub = _transport(b.url, reconnect_min_delay=0.1, reconnect_max_delay=0.5)
        try:
            subscribed(sub, f"{topic_prefix}/live")
            b.restart()
            assert _wait_for(lambda: sub.connect_count == 2 and pub.connect_count == 2, 10)
            assert sub.connected
            # the subscription was re-applied by on_connect
            pub.publish(f"{topic_prefix}/live", b"after restart")
            assert pub.wait_published(5)
            msg = sub.receive(5)
            assert msg is not None and msg.payload == b"after restart"
            # qos-1 messages published while the broker is down are queued by paho
            b.stop()
            assert _wait_for(lambda: not pub.connected, 5)
            with pytest.raises(TransportError, match="qos 0"):
                pub.publish(f"{topic_prefix}/q0", b"lost", qos=0)
            for i in range(30):
                pub.publish(f"{topic_prefix}/queued/{i}", str(i).encode(), retain=True)
            assert not pub.wait_published(0.2)
            b.start()
            assert pub.wait_published(10) and pub.connect_count == 3
            with _transport(b.url) as late:
                late.subscribe(f"{topic_prefix}/queued/+")
                got = {late.receive(5) for _ in range(30)}
                assert {m.payload for m in got if m is not None} == {str(i).encode() for i in range(30)}
        finally:
            sub.close()
            pub.close()


def test_each_connection_has_its_own_stamped_will_and_birth(topic_prefix: str) -> None:
    """Will and birth built per connection carry that connection's stamp, which increases: the
    will the broker publishes for a lost connection names it, and the birth after the reconnect
    names the new one (so a reader can order them whatever order they arrive in)."""
    topic = f"{topic_prefix}/stamped/status"

    def presence(state: str) -> Callable[[int], Will]:
        return lambda stamp: Will(topic, f"{state} {stamp}".encode())
    with EmbeddedBroker() as b, FaultProxy(b.port) as proxy, _transport(b.url) as observer:
        subscribed(observer, topic)
        device = _transport(proxy.url, will=presence("offline"), birth=presence("online"),
                            reconnect_min_delay=0.1, reconnect_max_delay=0.5)
        try:
            first = device.connection_stamp
            msg = observer.receive(5)
            assert msg is not None and msg.payload == f"online {first}".encode()
            proxy.drop_connections()  # no DISCONNECT: the broker publishes the will
            assert _wait_for(lambda: device.connect_count == 2, 10)
            second = device.connection_stamp
            assert second > first
            got = [observer.receive(5), observer.receive(5)]
            assert sorted(m.payload for m in got if m is not None) == sorted(
                [f"offline {first}".encode(), f"online {second}".encode()])
        finally:
            device.close()


@needs("mosquitto", "mosquitto_passwd")
def test_wrong_credentials_give_clear_error(tmp_path: pytest.TempPathFactory) -> None:
    pwfile = tmp_path / "passwd"  # type: ignore[operator]
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pwfile), "alice", "s3cret"],
                   check=True, capture_output=True)
    cfg = BrokerConfig(prefer="mosquitto", extra_config=(f"password_file {pwfile}", "allow_anonymous false"))
    with EmbeddedBroker(cfg) as b:
        for user, pw in (("alice", "wrong"), ("mallory", "s3cret")):
            t = MqttTransport(TransportConfig(url=b.url, username=user, password=pw, connect_timeout=3))
            with pytest.raises(TransportError, match="(?i)bad user name or password|not authori"):
                t.connect()
            assert t.connect_count == 0 and not t.connected
            t.close()
        anon = MqttTransport(TransportConfig(url=b.url, connect_timeout=3))
        with pytest.raises(TransportError, match="(?i)not authori|bad user"):
            anon.connect()
        with _transport(b.url, username="alice", password="s3cret") as ok:
            assert ok.connected and ok.protocol_version == "5"


def test_bounded_queue_counts_drops(broker: EmbeddedBroker, topic_prefix: str) -> None:
    with _transport(broker.url) as producer, _transport(broker.url, inbox=InboxLimits(max_messages=3, per_source_messages=3)) as consumer:
        subscribed(consumer, f"{topic_prefix}/n")
        for i in range(10):
            producer.publish(f"{topic_prefix}/n", bytes([i]))
        assert producer.wait_published(5)
        assert _wait_for(lambda: consumer.dropped == 7)
        payloads = [consumer.receive(1) for _ in range(3)]
        assert [m.payload for m in payloads if m is not None] == [b"\x00", b"\x01", b"\x02"]
        assert consumer.receive(0.1) is None


def test_publish_backs_off_while_too_many_are_unacknowledged(broker: EmbeddedBroker, topic_prefix: str) -> None:
    """paho fails ("Message queue full") once its 65,535 message ids are in use; publish() waits for
    acknowledgements above `max_outgoing` instead, and raises TransportError only after
    `outgoing_wait_s` — the caller decides, nothing inside paho breaks."""
    with FaultProxy(broker.port) as proxy:
        t = _transport(proxy.url, max_outgoing=3, outgoing_wait_s=0.5)
        try:
            proxy.hold()  # the broker never sees them: no PUBACK comes back
            for i in range(3):
                t.publish(f"{topic_prefix}/held", bytes([i]))
            assert t.outgoing == 3
            started = time.monotonic()
            with pytest.raises(TransportError, match="unacknowledged, none for 0.5 s"):
                t.publish(f"{topic_prefix}/held", b"one too many")
            assert time.monotonic() - started >= 0.45
            proxy.release()
            assert t.wait_published(5) and t.outgoing == 0
            t.publish(f"{topic_prefix}/held", b"room again")  # no wait now
            assert t.wait_published(5)
        finally:
            t.close()


def test_publish_waits_for_room_in_bytes(broker: EmbeddedBroker, topic_prefix: str) -> None:
    """Above `max_outgoing_bytes` unacknowledged, publish() waits too (a larger message goes alone),
    and gives up when no acknowledgement came for `outgoing_wait_s`."""
    with FaultProxy(broker.port) as proxy:
        t = _transport(proxy.url, max_outgoing_bytes=1_000, outgoing_wait_s=0.6)
        try:
            t.publish(f"{topic_prefix}/big", b"x" * 5_000)  # nothing pending: goes alone
            assert t.wait_published(5)
            proxy.hold()
            t.publish(f"{topic_prefix}/b", b"a" * 600)
            with pytest.raises(TransportError, match=r"1 earlier messages \(600 bytes\) are still unacknowledged, "
                                                     r"none for 0.6 s"):
                t.publish(f"{topic_prefix}/b", b"b" * 600)  # 1,200 bytes would be over the budget
            proxy.release()
            assert t.wait_published(5) and t.outgoing == 0
            t.publish(f"{topic_prefix}/b", b"b" * 600)  # room again
            assert t.wait_published(5)
        finally:
            t.close()
