"""A disk that is full for this process: the file-size limit (RLIMIT_FSIZE) set so that no regular
file may grow past ``nbytes``; a write past it fails with EFBIG, as a full disk fails with ENOSPC,
after writing what fits."""

from __future__ import annotations

import contextlib
import resource
import signal
from typing import Iterator

__all__ = ["full_disk"]


@contextlib.contextmanager
def full_disk(nbytes: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)
