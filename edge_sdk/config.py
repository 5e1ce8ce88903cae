"""TOML configuration files (read with tomllib; never executed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from edge_sdk.networking.link import LinkConfig
from edge_sdk.networking.transport import TransportConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6, Ubuntu 22.04): the same parser, as the tomli package
    import tomli as tomllib

__all__ = ["read_toml", "transport_from_toml", "link_from_toml", "section", "setting", "in_file"]


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


_KINDS: dict[type, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                           list: "a list"}


def setting(table: dict[str, Any], key: str, kind: type, default: Any = None, where: str = "") -> Any:
    """``table[key]`` (``default`` when absent) checked to be of ``kind`` (int, float: an int or float,
    str, bool, list); a wrong type is a one-line ValueError naming the key (in table ``where``, e.g.
    ``"[broker]"``), what was expected and what was found."""
    if key not in table:
        return default
    value = table[key]
    ok = (type(value) in (int, float) if kind is float else type(value) is kind)
    if not ok:
        name = f"{where} {key}".strip()
        raise ValueError(f"{name} must be {_KINDS.get(kind, kind.__name__)}, got {str(value)[:40]!r}")
    return float(value) if kind is float else value


def in_file(path: str | Path, exc: BaseException) -> ValueError:
    """``exc`` as a one-line ValueError that names the config file (once)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc)
    prefix = f"{path}: "
    return ValueError(text if text.startswith(prefix) else prefix + text)


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
    return LinkConfig(chunk_size=setting(link, "chunk_size", int, 1 << 20, "[link]"),
                      transfer_dtype=setting(link, "transfer_dtype", str, None, "[link]"),
                      reassembly_timeout_s=setting(link, "reassembly_timeout_s", float, 30.0, "[link]"))


_BROKER_KEYS = {"url", "username", "password", "password_file", "ca_file", "cert_file", "key_file",
                "tls_insecure", "keepalive", "protocol"}


def transport_from_toml(config: dict[str, Any], client_id: str) -> TransportConfig:
    """The `[broker]` table as a TransportConfig; a password may come from a file."""
    broker = section(config, "broker", _BROKER_KEYS)

    def text(key: str, default: str | None = None) -> str | None:
        return setting(broker, key, str, default, "[broker]")

    password = text("password")
    password_file = text("password_file")
    if password_file is not None:
        try:
            password = Path(password_file).expanduser().read_text().strip()
        except OSError as exc:
            raise ValueError(f"[broker] password_file {password_file} cannot be read: "
                             f"{exc.strerror or exc}") from None
    for key in ("ca_file", "cert_file", "key_file"):
        name = text(key)
        if name is not None and not Path(name).expanduser().is_file():
            raise ValueError(f"[broker] {key} {name} does not exist (or is not a file)")
    return TransportConfig(
        url=text("url", "mqtt://127.0.0.1:1883"), client_id=client_id,
        username=text("username"), password=password,
        ca_file=text("ca_file"), cert_file=text("cert_file"), key_file=text("key_file"),
        tls_insecure=setting(broker, "tls_insecure", bool, False, "[broker]"),
        keepalive=setting(broker, "keepalive", int, 30, "[broker]"),
        protocol=text("protocol", "auto"),
    )
