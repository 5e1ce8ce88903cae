"""Which torch device a device's training runs on: ``auto``, ``cpu`` or ``cuda[:N]``.

The profile measures the same device (`edgefl profile --device`), so that the coordinator
sizes a Jetson for the GPU it will really train on.
"""

from __future__ import annotations

import re

import torch

__all__ = ["DEVICE_CHOICES", "check_device_name", "resolve_device"]

#: what a client TOML's ``[device] device`` and ``--device`` accept (``cuda:N`` picks a GPU)
DEVICE_CHOICES = ("auto", "cpu", "cuda")
_NAME = re.compile(r"auto|cpu|cuda(:\d{1,2})?")


def check_device_name(name: str) -> str:
    """``name`` when it is a device name's syntax (``auto``, ``cpu``, ``cuda``, ``cuda:N``), else
    ValueError (one line, listing the choices). Pure: asks torch nothing, so a settings object
    validates with it; `resolve_device` checks the GPU is there, where the device is used."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)} or cuda:N, got {name!r}")
    return name


def resolve_device(name: str = "auto") -> torch.device:
    """``auto``: the first CUDA GPU when torch sees one, else the CPU; ``cpu``; ``cuda`` or
    ``cuda:N`` (ValueError, one line, when torch has no such GPU)."""
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this torch sees no CUDA GPU (a CPU-only build, or no driver); "
                             f"use device \"cpu\" or \"auto\"")
        if (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA GPU(s) here")
    return device
