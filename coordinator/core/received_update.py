"""A device's update as the fleet accepted it: validated, with the wire bytes it took."""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.protocol.messages import Update

__all__ = ["ReceivedUpdate"]


@dataclass(frozen=True)
class ReceivedUpdate:
    """A validated update and the wire bytes it took."""

    device_id: str
    round: int
    update: Update
    nbytes: int
