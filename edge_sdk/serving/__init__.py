"""Serving: a device runs its installed model on live readings from MQTT topics (docs/serving.md).
Windows the home labels (home_labels.py) and a person's corrections go to the device's label store
(edge_sdk/data/label_store.py), which its training reads. Imports numpy, paho and onnxruntime only —
a device that only serves needs no torch."""

from edge_sdk.serving.home_labels import HomeLabels, LabelsConfig, labels_from_toml
from edge_sdk.data.label_store import LabelStore
from edge_sdk.serving.readings import BadReading, Reading, parse_reading
from edge_sdk.serving.serve_config import ServeConfig, ServeInput, serve_from_toml
from edge_sdk.serving.server import Server
from edge_sdk.serving.windows import Window, WindowBuilder, WindowCounts

__all__ = ["BadReading", "HomeLabels", "LabelStore", "LabelsConfig", "Reading", "labels_from_toml", "parse_reading",
           "ServeConfig", "ServeInput", "serve_from_toml", "Server", "Window", "WindowBuilder", "WindowCounts"]
