"""The ids of a simulation's devices: ``dev000``, ``dev001``, … by index."""

from __future__ import annotations

__all__ = ["device_id"]


def device_id(index: int) -> str:
    """The id of the simulation's device number ``index`` (from 0)."""
    return f"dev{index:03d}"
