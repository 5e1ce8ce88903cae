"""Serving: a device runs its installed model on live readings from MQTT topics (docs/serving.md).
Imports numpy, paho and onnxruntime only — a device that only serves needs no torch."""

from edge_sdk.serving.readings import BadReading, Reading, parse_reading
from edge_sdk.serving.serve_config import ServeConfig, ServeInput, serve_from_toml
from edge_sdk.serving.server import Server
from edge_sdk.serving.windows import Window, WindowBuilder, WindowCounts

__all__ = ["BadReading", "Reading", "parse_reading", "ServeConfig", "ServeInput", "serve_from_toml", "Server",
           "Window", "WindowBuilder", "WindowCounts"]
