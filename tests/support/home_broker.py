"""The home server's broker for tests: deploy/homeserver's mosquitto.conf, ACL, certificates and users,
templated onto a free loopback port in a temporary folder (no root, no /etc)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker, free_port
from edge_sdk.config import read_toml, transport_from_toml
from edge_sdk.networking.transport import MqttTransport, TransportConfig

__all__ = ["HOME", "HomeBroker", "start_home_broker"]

HOME = Path(__file__).resolve().parents[2] / "deploy" / "homeserver"


def _conf_lines(tls_port: int, passwd: Path, acl: Path, certs: Path) -> tuple[str, ...]:
    """deploy/homeserver/mosquitto.conf with its paths and port moved into the test's sandbox."""
    subst = {"/etc/mosquitto/edgefl.passwd": str(passwd), "/etc/mosquitto/edgefl.acl": str(acl),
             "/etc/mosquitto/certs": str(certs), "listener 8883": f"listener {tls_port} 127.0.0.1"}
    lines = []
    for line in (HOME / "mosquitto.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            for old, new in subst.items():
                line = line.replace(old, new)
            lines.append(line)
    return tuple(lines)


@dataclass
class HomeBroker:
    """A running mosquitto with the shipped configuration, and the bundles add-device.sh made."""

    tmp: Path
    port: int
    ca: Path
    broker: EmbeddedBroker
    acl: Path
    passwd: Path

    @property
    def url(self) -> str:
        return f"mqtts://127.0.0.1:{self.port}"

    def device_config(self, name: str, **overrides: object) -> TransportConfig:
        """The transport settings of the bundle add-device.sh wrote for ``name`` (paths made local)."""
        bundle = self.tmp / name
        config = read_toml(bundle / "client.toml")
        config["broker"].update(password_file=str(bundle / "password"), ca_file=str(bundle / "ca.crt"))
        base = transport_from_toml(config, client_id=name)
        return TransportConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, **overrides})

    def device(self, name: str, **overrides: object) -> MqttTransport:
        """A connected transport with ``name``'s credentials."""
        transport = MqttTransport(self.device_config(name, **overrides))
        transport.connect()
        return transport

    def coordinator_config(self, **overrides: object) -> TransportConfig:
        password = (self.tmp / "coordinator" / "coordinator.password").read_text().strip()
        return TransportConfig(**{"url": self.url, "client_id": "coord", "username": "coordinator",
                                  "password": password, "ca_file": str(self.ca), **overrides})

    def homeassistant(self, **overrides: object) -> MqttTransport:
        """A connected transport with Home Assistant's credentials (add-device.sh --homeassistant)."""
        password = (self.tmp / "homeassistant" / "homeassistant.password").read_text().strip()
        transport = MqttTransport(TransportConfig(**{"url": self.url, "client_id": "ha", "username": "homeassistant",
                                                     "password": password, "ca_file": str(self.ca), **overrides}))
        transport.connect()
        return transport

    def coordinator(self, **overrides: object) -> MqttTransport:
        """A connected transport with the coordinator's credentials."""
        transport = MqttTransport(self.coordinator_config(**overrides))
        transport.connect()
        return transport

    def stop(self) -> None:
        self.broker.stop()


def start_home_broker(tmp: Path, devices: tuple[str, ...] = ("pi-a", "pi-b"), homeassistant: bool = False,
                      reads: dict[str, tuple[str, ...]] | None = None, zigbee2mqtt: str | None = None) -> HomeBroker:
    """Certificates (make-certs.sh), users and bundles (add-device.sh) for ``devices`` (``reads``: a
    device's sensor topics, `--reads`), the coordinator (and Home Assistant), and a started mosquitto
    with the shipped mosquitto.conf and ACL; ``zigbee2mqtt``: a password for the ACL template's
    commented zigbee2mqtt user, uncommented (and Home Assistant's zigbee2mqtt line)."""
    certs, passwd = tmp / "certs", tmp / "edgefl.passwd"
    subprocess.run([HOME / "make-certs.sh", "edgefl-test", "--out", certs], check=True, capture_output=True)
    port = free_port()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "EDGEFL_CA_FILE": str(certs / "ca.crt")}
    for device in devices:
        more = [arg for topic in (reads or {}).get(device, ()) for arg in ("--reads", topic)]
        subprocess.run([HOME / "add-device.sh", "--passwd", passwd, "--out", tmp / device, "--no-reload",
                        "--broker-url", f"mqtts://127.0.0.1:{port}", *more, device], check=True, env=env,
                       capture_output=True)
    subprocess.run([HOME / "add-device.sh", "--passwd", passwd, "--out", tmp / "coordinator", "--no-reload",
                    "--coordinator"], check=True, env=env, capture_output=True)
    if homeassistant:
        subprocess.run([HOME / "add-device.sh", "--passwd", passwd, "--out", tmp / "homeassistant", "--no-reload",
                        "--homeassistant"], check=True, env=env, capture_output=True)
    acl = tmp / "edgefl.acl"  # add-device.sh made it next to the password file from deploy/homeserver/edgefl.acl
    if zigbee2mqtt is not None:
        subprocess.run(["mosquitto_passwd", "-b", passwd, "zigbee2mqtt", zigbee2mqtt], check=True, capture_output=True)
        text = acl.read_text()
        for line in ("#user zigbee2mqtt", "#topic deny edgefl/#", "#topic readwrite zigbee2mqtt/#",
                     "#topic write homeassistant/#", "#topic read homeassistant/status"):
            assert "\n" + line + "\n" in text, line
            text = text.replace("\n" + line + "\n", "\n" + line[1:] + "\n")
        acl.write_text(text)
    broker = EmbeddedBroker(BrokerConfig(prefer="mosquitto", extra_config=_conf_lines(port, passwd, acl, certs)))
    broker.start()
    broker.wait_for_listener(port)  # the broker waited for its own plain listener; the TLS one too
    return HomeBroker(tmp, port, certs / "ca.crt", broker, acl, passwd)
