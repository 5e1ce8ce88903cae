"""`edgefl simulate --backend process`: the simulated devices in one child process beside the
coordinator's, so that the two use two cores (on one process they share one interpreter lock).

The child is a `DeviceActor` without Ray: it maps the devices' data from the folder this process
saved it to (`DeviceShards`), hosts every device (`sim_devices.DeviceHost`) and trains them one at
a time with ``threads`` torch threads. What crosses the pipe is plain data: the job's settings as
JSON, the trusted public keys as hex, and back where the devices run and which did not stop —
JSON bytes both ways, never pickles.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulation.config import SimulationConfig

__all__ = ["ProcessDevices"]

log = logging.getLogger(__name__)

#: Seconds the child may take to import, map the data and open its devices' connections.
START_TIMEOUT_S = 300.0


def _send(conn: multiprocessing.connection.Connection, *message: Any) -> None:
    conn.send_bytes(json.dumps(message).encode())


def _read(conn: multiprocessing.connection.Connection) -> list[Any]:
    message = json.loads(conn.recv_bytes(1 << 20))
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise OSError(f"unexpected message from the other process: {str(message)[:100]}")
    return message


def _serve(conn: multiprocessing.connection.Connection, log_level: int) -> None:
    """The child: import what the devices need while the parent loads the data, then start the
    devices when told (the job's settings, the broker, the data's folder), say where they run, and
    stop them when told (or when the parent is gone). Ctrl-C is the parent's to handle: it tells
    the child to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    from edge_sdk.training import warm_up_optimizer
    from simulation.ray_devices import DeviceActor

    warm_up_optimizer()  # before the first round, while the parent loads the data

    try:
        message = _read(conn)
        if message[0] != "start":
            return
        config_json, url, threads, trusted_keys, shards_dir = message[1:]
        if not os.path.isdir(shards_dir):
            raise FileNotFoundError(f"the devices' data folder {shards_dir} is missing")
        clients = int(json.loads(config_json)["clients"])
        actor = DeviceActor(config_json, url, list(range(clients)), threads, tuple(trusted_keys), shards_dir)
        _send(conn, "started", actor.start(None))
    except Exception as exc:  # one line to the parent, which raises it
        with contextlib.suppress(OSError):
            _send(conn, "failed", f"{type(exc).__name__}: {exc}")
        return
    wait_s = 0.0
    try:
        message = _read(conn)
        if message[0] == "stop":
            wait_s = float(message[1])
    except (EOFError, OSError, ValueError):  # the parent is gone: stop at once
        pass
    stuck = actor.stop(wait_s)
    with contextlib.suppress(OSError):
        _send(conn, "stopped", stuck)


class ProcessDevices:
    """The simulated devices of a job in one child process: `prepare` starts the process (it
    imports while this one loads the data), `start` starts the devices, `stop` ends them."""

    def __init__(self, config: "SimulationConfig") -> None:
        self.config = config
        self._conn: multiprocessing.connection.Connection | None = None
        self._process: Any = None

    def prepare(self) -> None:
        """Start the child process; it waits for `start`."""
        context = multiprocessing.get_context("spawn")  # not fork: this process has threads
        self._conn, theirs = context.Pipe()
        self._process = context.Process(target=_serve, name="edgefl-devices", daemon=True,
                                        args=(theirs, logging.getLogger().getEffectiveLevel()))
        self._process.start()
        theirs.close()

    def start(self, url: str, trusted_keys: tuple[bytes, ...], shards_dir: str) -> dict[str, Any]:
        """Start the devices on the broker at ``url``, trusting models signed by ``trusted_keys``,
        with their data in ``shards_dir`` (blocking until they are connecting); where they run."""
        if self._conn is None:
            self.prepare()
        assert self._conn is not None
        try:
            _send(self._conn, "start", json.dumps(self.config.to_plain()), url, self.config.threads or 1,
                  [k.hex() for k in trusted_keys], shards_dir)
            reply = self._receive(START_TIMEOUT_S)
        except OSError as exc:
            reply = ["failed", f"it ended ({exc})"]
        if reply is None or reply[0] != "started":
            self.close()
            why = reply[1] if reply is not None else f"no answer within {START_TIMEOUT_S:g} s"
            raise RuntimeError(f"the simulated devices' process did not start: {why}")
        placed: dict[str, Any] = reply[1]
        placed.pop("devices", None)  # every device: the report need not list them
        return placed

    def stop(self, wait_s: float) -> None:
        """Tell the child to end its devices (a device inside a step gets ``wait_s`` to leave it)
        and wait for it to exit; killed if it does not."""
        if self._conn is None:
            return
        try:
            _send(self._conn, "stop", wait_s)
            reply = self._receive(wait_s + 30.0)
            for name in reply[1] if reply is not None and reply[0] == "stopped" else []:
                log.warning("device %s did not stop in time", name)
        except OSError as exc:  # the child died: nothing to stop
            log.warning("the simulated devices' process ended early: %s", exc)
        self._process.join(timeout=10.0)
        self.close()

    def _receive(self, timeout: float) -> list[Any] | None:
        assert self._conn is not None
        try:
            if self._conn.poll(timeout):
                return _read(self._conn)
        except (EOFError, OSError, ValueError):
            pass
        return None

    def close(self) -> None:
        """End the child process if it is still there (killed) — after `stop`, or instead of it."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
