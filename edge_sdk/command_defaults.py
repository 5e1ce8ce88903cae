"""The defaults of the device's commands (``edgefl profile``, ``edgefl predict``), in one place,
without torch: the command line reads them, and so do the functions it calls
(`edge_sdk.profiling.measure_device`, `edge_sdk.inference.OnnxClassifier`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceCommandDefaults", "DEVICE_COMMANDS"]


@dataclass(frozen=True)
class DeviceCommandDefaults:
    """What ``edgefl profile`` and ``edgefl predict`` do unless told otherwise."""

    #: the name a measured profile gets (with a client TOML: its ``device_id``)
    profile_name: str = "this-device"
    #: seconds per micro-benchmark of a measurement
    measure_seconds: float = 1.0
    #: samples per onnxruntime run
    predict_batch_size: int = 256
    #: the most likely classes listed per sample
    predict_top: int = 1


#: The defaults the device's commands start from.
DEVICE_COMMANDS = DeviceCommandDefaults()
