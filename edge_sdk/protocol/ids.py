"""Message and transfer ids: 128 random bits as 32 hex digits, as ``uuid.uuid4().hex`` gave them.

``uuid4`` asks the kernel for 16 bytes on every call, and Python lets go of its interpreter lock
around that system call: in a busy process (a coordinator beside thousands of simulated devices,
or a host of devices each making messages) every id then waited for the lock to come back —
beside three busy threads 2,645 ids a second, against 786,505 from here (bench/id_contention.py). These ids
come from the same source (``os.urandom``), read 4 KiB at a time: one system call per 256 ids. A
forked child reads afresh, so that it never repeats its parent's ids.
"""

from __future__ import annotations

import os
import threading

__all__ = ["new_id"]

_POOL_BYTES = 4096
_ID_BYTES = 16


class _RandomIds:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._next = 0

    def take(self) -> str:
        with self._lock:
            if self._next + _ID_BYTES > len(self._pool):
                self._pool, self._next = os.urandom(_POOL_BYTES), 0
            start = self._next
            self._next = start + _ID_BYTES
            return self._pool[start:start + _ID_BYTES].hex()

    def forget(self) -> None:
        """After a fork: the parent's unread bytes are not this process' (a fresh lock too)."""
        self._lock = threading.Lock()
        self._pool, self._next = b"", 0


_IDS = _RandomIds()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDS.forget)


def new_id() -> str:
    """A fresh random id: 32 lowercase hex digits (128 bits from ``os.urandom``)."""
    return _IDS.take()
