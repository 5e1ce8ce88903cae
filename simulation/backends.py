"""Where a simulation's devices run (`--backend`), light enough for the command line to import."""

from __future__ import annotations

__all__ = ["BACKENDS", "LOCAL_BACKEND_UP_TO", "devices_backend"]

#: local: every device in the coordinator's process; process: all of them in one child process;
#: ray: spread over Ray actors; auto: local up to `LOCAL_BACKEND_UP_TO` devices, process past that.
BACKENDS = ("auto", "local", "process", "ray")
#: `--backend auto` keeps up to this many devices in the coordinator's process. Past it the start-up
#: (every device's registration, handled on both sides in Python) is shared between two processes:
#: 10,000 devices reached the end of round 1 about 2 s sooner that way (BENCHMARKS.md, issue 39).
LOCAL_BACKEND_UP_TO = 1_000


def devices_backend(backend: str, clients: int) -> str:
    """``backend`` with "auto" resolved for a fleet of ``clients`` devices."""
    if backend != "auto":
        return backend
    return "local" if clients <= LOCAL_BACKEND_UP_TO else "process"
