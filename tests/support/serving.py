"""A served model and Home Assistant's side of serving, for the serving tests."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from edge_sdk.model_store import save_model
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from edge_sdk.protocol.messages import Model

__all__ = ["CLASSES", "LENGTH", "Home", "install_model"]

LENGTH, CLASSES = 24, ("idle", "kettle")


def install_model(state_dir: Path, version: int = 7, channels: int = 1, seed: int = 0) -> None:
    """A cnn1d on ``channels`` x 24 raw readings (normalisation in the graph), exported as the
    coordinator exports it, installed as a device installs a published model."""
    import torch

    from coordinator.runtime.export import export_onnx
    from edge_sdk.data.preprocessing import Preprocessing
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import cnn1d

    torch.manual_seed(seed)
    model = build_model(cnn1d(channels, len(CLASSES), LENGTH, width=0.25))
    x = np.random.default_rng(0).normal(100.0, 50.0, size=(4, channels, LENGTH)).astype(np.float32)
    path = state_dir / "export.onnx"
    export_onnx(model, path, x, preprocessing=Preprocessing((100.0,) * channels, (50.0,) * channels, CLASSES,
                                                            (channels, LENGTH)))
    data = path.read_bytes()
    save_model(state_dir, Model("global", 3, hashlib.sha256(data).digest(), data, (channels, LENGTH),
                                version=version))


class Home:
    """Home Assistant's side: publishes readings as a plug does, reads the predictions."""

    def __init__(self, url: str, topic: str) -> None:
        self.transport = MqttTransport(TransportConfig(url=url, client_id=f"home-{time.monotonic_ns()}"))
        self.transport.connect()
        self.transport.subscribe(topic)
        self.predictions: list[dict] = []

    def read(self, until, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not until():
            message = self.transport.receive(timeout=0.2)
            if message is not None:
                self.predictions.append(json.loads(message.payload))
