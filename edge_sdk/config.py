"""TOML configuration files (read with tomllib; never executed)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from edge_sdk.link import LinkConfig
from edge_sdk.transport import TransportConfig

__all__ = ["read_toml", "transport_from_toml", "link_from_toml", "section"]


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; errors name the file."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from None


def section(config: dict[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    """A table of the config, with unknown keys rejected (typos must not pass silently)."""
    table = config.get(name, {})
    if not isinstance(table, dict):
        raise ValueError(f"[{name}] must be a table")
    unknown = set(table) - allowed
    if unknown:
        raise ValueError(f"[{name}]: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    return table


def link_from_toml(config: dict[str, Any]) -> LinkConfig:
    """The `[link]` table (the same for a device and the coordinator): ``chunk_size``,
    ``transfer_dtype`` and ``reassembly_timeout_s`` (a chunked message stalled this long is given
    up: a device asks for it again)."""
    link = section(config, "link", {"chunk_size", "transfer_dtype", "reassembly_timeout_s"})
    return LinkConfig(chunk_size=int(link.get("chunk_size", 1 << 20)), transfer_dtype=link.get("transfer_dtype"),
                      reassembly_timeout_s=float(link.get("reassembly_timeout_s", 30.0)))


_BROKER_KEYS = {"url", "username", "password", "password_file", "ca_file", "cert_file", "key_file",
                "tls_insecure", "keepalive", "protocol"}


def transport_from_toml(config: dict[str, Any], client_id: str) -> TransportConfig:
    """The `[broker]` table as a TransportConfig; a password may come from a file."""
    broker = section(config, "broker", _BROKER_KEYS)
    password = broker.get("password")
    if "password_file" in broker:
        password = Path(broker["password_file"]).read_text().strip()
    return TransportConfig(
        url=broker.get("url", "mqtt://127.0.0.1:1883"), client_id=client_id,
        username=broker.get("username"), password=password,
        ca_file=broker.get("ca_file"), cert_file=broker.get("cert_file"), key_file=broker.get("key_file"),
        tls_insecure=bool(broker.get("tls_insecure", False)), keepalive=int(broker.get("keepalive", 30)),
        protocol=str(broker.get("protocol", "auto")),
    )
