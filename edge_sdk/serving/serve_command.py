"""``edgefl serve --config client.toml``: a device serves its installed model on its ``[serve]``
topics — torch-free, beside ``edgefl client`` or alone (a device that only serves). ``edgefl client``
with a ``[serve]`` table serves too, on a thread of its own (`serving_thread`)."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from edge_sdk.config import read_toml, section, setting, transport_from_toml
from edge_sdk.networking.transport import MqttTransport, Will
from edge_sdk.protocol.topics import Topics
from edge_sdk.serving.home_labels import LabelsConfig, labels_from_toml
from edge_sdk.serving.serve_config import ServeConfig, serve_from_toml
from edge_sdk.serving.server import Server
from edge_sdk.serving.source_rows import SourceRows
from edge_sdk.sources.from_toml import DATA_KEYS, DEFAULT_STATE_DIR, data_source_from_toml, holdout_from_toml

__all__ = ["server_from_toml", "serving_tables", "serving_thread"]

log = logging.getLogger(__name__)


def serving_tables(config: dict) -> tuple[ServeConfig | None, LabelsConfig | None]:
    """``[serve]`` and ``[labels]`` (each None when absent); ``[labels]`` needs ``[serve]``: the
    windows it labels are the ones served."""
    serve, labels = serve_from_toml(config), labels_from_toml(config)
    if labels is not None and serve is None:
        raise ValueError("[labels] needs a [serve] table: the windows it labels are those the device serves")
    return serve, labels


def server_from_toml(path: str | Path) -> Server | None:
    """The server a client TOML's ``[serve]`` describes (connected), None without one; a bad
    value is a one-line ValueError naming the file and key."""
    config = read_toml(path)
    try:
        serve, labels = serving_tables(config)
        if serve is None:
            return None
        holdout = holdout_from_toml(config)
        rows = None
        if serve.rows:  # the [data] source's new rows whose label is empty
            reread_s = setting(section(config, "data", DATA_KEYS), "reread_s", float, 60.0, "[data]")
            rows = SourceRows(data_source_from_toml(config, unlabelled=True), reread_s)
        device_id = setting(config, "device_id", str)
        if device_id is None:
            raise ValueError("device_id is required")
        job = setting(config, "job", str, "default")
        state_dir = setting(config, "state_dir", str, DEFAULT_STATE_DIR)
        transport_config = transport_from_toml(config, client_id=f"{device_id}-serve")
        if serve.username is not None:  # its own MQTT user: the device's connection is not taken over
            transport_config = replace(transport_config, username=serve.username,
                                       password=_password(serve.password_file))
        topics = Topics(job=job)
        available = topics.serving_availability(device_id)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    # serving entities in Home Assistant follow this connection alone (the coordinator may be down)
    transport = MqttTransport(replace(transport_config, will=Will(available, b"offline"),
                                      birth=Will(available, b"online")))
    transport.connect()
    return Server(serve, transport, topics, device_id, state_dir, labels=labels, holdout=holdout, rows=rows)


def _password(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise ValueError(f"[serve] password_file {path} cannot be read: {exc.strerror or exc}") from None


def serving_thread(path: str | Path, stop: threading.Event) -> threading.Thread | None:
    """A started daemon thread serving a client TOML's ``[serve]`` until ``stop`` (None without one)."""
    server = server_from_toml(path)
    if server is None:
        return None

    def serve() -> None:
        try:
            server.run(stop)
        finally:
            server.close()
    thread = threading.Thread(target=serve, name="edgefl-serve", daemon=True)
    thread.start()
    return thread
