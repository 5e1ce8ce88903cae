"""A device that starts before its broker keeps trying for `connect_retry_s`, then joins."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker, free_port
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.methods import LocalData
from edge_sdk.profiling import load_profile
from edge_sdk.networking.transport import TransportConfig, TransportError


def _client(port: int, retry_s: float, connect_timeout: float = 10.0) -> DeviceClient:
    data = LocalData(np.zeros((4, 8), np.float32), np.zeros(4, np.int64), 2)
    transport = TransportConfig(url=f"mqtt://127.0.0.1:{port}", connect_timeout=connect_timeout)
    return DeviceClient(ClientConfig(device_id="late", transport=transport, job="retry", connect_retry_s=retry_s),
                        data, load_profile("laptop"))


@pytest.mark.slow
def test_a_device_started_before_the_broker_connects_when_it_comes_up() -> None:
    port = free_port()
    client = _client(port, retry_s=30.0)
    ended: list[str] = []
    thread = threading.Thread(target=lambda: ended.append(client.run(timeout_s=6.0)), daemon=True)
    thread.start()
    time.sleep(1.5)  # the device has failed to connect at least once by now
    with EmbeddedBroker(BrokerConfig(port=port)):
        thread.join(timeout=40)
    assert ended == ["timeout"]  # it connected and served until its own timeout, no error


def test_without_retry_a_missing_broker_fails_at_once_with_the_reason() -> None:
    # The transport itself retries a refused socket until its connect_timeout (10 s by default);
    # 1 s here. One attempt takes ~1 s; a retry by the device would take >= 1 + 0.5 + 1 s.
    started = time.monotonic()
    with pytest.raises(TransportError, match=r"cannot connect .*unreachable within 1 s \(ConnectionRefusedError"):
        _client(free_port(), retry_s=0.0, connect_timeout=1.0).run(timeout_s=5.0)
    assert time.monotonic() - started < 2.4
