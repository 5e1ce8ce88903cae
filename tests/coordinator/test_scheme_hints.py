"""Dialling a TLS listener with mqtt:// (or a plain one with mqtts://) fails with one line
that says which scheme to use, and paho's socket errors of the failed attempt are not printed."""

from __future__ import annotations

import logging
import subprocess

import pytest

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker, free_port
from edge_sdk.networking.transport import MqttTransport, TransportConfig, TransportError
from tests.support.requirements import needs
from tests.support.paths import REPO_ROOT

MAKE_CERTS = REPO_ROOT / "deploy" / "homeserver" / "make-certs.sh"

pytestmark = needs("mosquitto", "openssl")


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    certs = tmp_path_factory.mktemp("certs")
    subprocess.run([MAKE_CERTS, "edgefl-test", "--out", certs], check=True, capture_output=True)
    port = free_port()
    lines = (f"listener {port} 127.0.0.1", f"certfile {certs / 'server.crt'}", f"keyfile {certs / 'server.key'}",
             f"cafile {certs / 'ca.crt'}", "allow_anonymous true")
    with EmbeddedBroker(BrokerConfig(prefer="mosquitto", extra_config=lines)) as broker:
        broker.wait_for_listener(port)
        yield broker, port, certs / "ca.crt"


def test_plain_client_on_a_tls_port_is_told_to_use_mqtts(tls_broker, caplog) -> None:
    broker, port, ca = tls_broker
    transport = MqttTransport(TransportConfig(url=f"mqtt://127.0.0.1:{port}", client_id="plain", connect_timeout=5))
    with caplog.at_level(logging.INFO), pytest.raises(TransportError) as err:
        transport.connect()
    assert f"use mqtts://127.0.0.1:{port}" in str(err.value) and "\n" not in str(err.value)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    ok = MqttTransport(TransportConfig(url=f"mqtts://127.0.0.1:{port}", client_id="tls", ca_file=str(ca)))
    ok.connect()  # the hint is right: the same port works with mqtts:// and the CA
    ok.close()


@pytest.mark.slow
def test_tls_client_on_a_plain_port_is_told_to_use_mqtt(tls_broker) -> None:
    broker = tls_broker[0]
    host, port = broker.url.removeprefix("mqtt://").split(":")
    transport = MqttTransport(TransportConfig(url=f"mqtts://{host}:{port}", client_id="tls", connect_timeout=2))
    with pytest.raises(TransportError, match=f"use mqtt://{host}:{port}"):
        transport.connect()
