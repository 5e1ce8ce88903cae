"""Devices taken out of a job while it runs: deploy/homeserver/remove-device.sh revokes a device's
password and ACL lines and appends its id to a file; the coordinator looks at that file between
messages and removes each new id from the fleet (`Fleet.remove`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from edge_sdk.protocol.topics import is_valid_id

__all__ = ["RemovedDevicesFile"]

log = logging.getLogger(__name__)

#: How often the file is looked at (one stat), and how much of it is read at most.
CHECK_EVERY_S = 2.0
MAX_BYTES = 1 << 20


class RemovedDevicesFile:
    """One device id per line in ``path`` (each ended by a newline; ``#`` starts a comment line);
    ``remove(id)`` is called once for each new valid id (others are skipped with one log line). A
    missing file is no removal; past `MAX_BYTES` the file is not read."""

    def __init__(self, path: str | Path, remove: Callable[[str], None]) -> None:
        self.path = Path(path)
        self.remove = remove
        self.seen: set[str] = set()
        self._stamp: tuple[float, int] | None = None
        self._checked = float("-inf")

    def check(self) -> None:
        """Remove the ids added since the last look (at most every `CHECK_EVERY_S`)."""
        now = time.monotonic()
        if now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        try:
            stat = self.path.stat()
            if (stat.st_mtime, stat.st_size) == self._stamp:
                return
            self._stamp = (stat.st_mtime, stat.st_size)
            with open(self.path, "rb") as file:
                data = file.read(MAX_BYTES)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("removed devices file %s unreadable: %s", self.path, exc)
            return
        # whole lines only: a line still being written (or cut by the bound) is taken once it is whole
        text = data[:data.rfind(b"\n") + 1].decode("utf-8", "replace")
        for line in text.splitlines():
            device = line.strip()
            if not device or device.startswith("#") or device in self.seen:
                continue
            self.seen.add(device)
            if is_valid_id(device):
                self.remove(device)
            else:
                log.warning("%s: %r is not a device id; skipped", self.path, device[:40])
