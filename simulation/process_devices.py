"""`edgefl simulate --backend process`: the simulated devices in one child process (or
``--device-processes N``) beside the coordinator's, so that they use more than one core (in one
process they share one interpreter lock).

A child is a `DeviceActor` without Ray: it maps the devices' data from the folder this process
saved it to (`DeviceShards`), hosts its devices (`sim_devices.DeviceHost`: device i in child
i mod N) and trains them one at a time with ``threads`` torch threads. What crosses the pipe is
plain data: the job's settings as JSON, the trusted public keys as hex, which devices are its, and
back where the devices run and which did not stop — JSON bytes both ways, never pickles.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulation.config import SimulationConfig

__all__ = ["ProcessDevices", "start_fork_server"]

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
        config_json, url, threads, trusted_keys, shards_dir, number, processes = message[1:]
        if not os.path.isdir(shards_dir):
            raise FileNotFoundError(f"the devices' data folder {shards_dir} is missing")
        indices = list(range(int(number), int(json.loads(config_json)["clients"]), int(processes)))
        actor = DeviceActor(config_json, url, indices, threads, tuple(trusted_keys), shards_dir)
        placed = actor.start(None)
        placed.pop("devices", None)  # every device's id: 1.2 MB at 100,000 devices, and the parent knows them
        _send(conn, "started", placed)
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


#: What the children's fork server imports once for all of them (`_start_context`): torch,
#: ``torch._dynamo`` (a process's first optimizer imports it: 68 MB) and the devices' code.
PRELOAD = ["torch", "torch._dynamo", "edge_sdk.training", "simulation.ray_devices"]


def _start_context() -> Any:
    """How the children start: forked from a fork server that imported `PRELOAD` once (a process
    of one thread: safe to fork), so that they share its pages of torch instead of importing it
    each (two children at 10,000 devices: about 1,250 → 1,075 MB of peak PSS, one import instead of
    two at start-up); spawned where there is no fork server (Windows). Not forked from this
    process: it has threads."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (once a process)
    return context


def start_fork_server() -> None:
    """Start the children's fork server now, so that it imports `PRELOAD` (2.6 s here) while this
    process imports and loads the data; nothing where children are spawned."""
    if _start_context().get_start_method() == "forkserver":
        import multiprocessing.forkserver

        multiprocessing.forkserver.ensure_running()


class _Child:
    """One child process and our end of its pipe."""

    def __init__(self, context: Any, number: int) -> None:
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_serve, name=f"edgefl-devices-{number}", daemon=True,
                                       args=(theirs, logging.getLogger().getEffectiveLevel()))
        self.process.start()
        theirs.close()

    def receive(self, timeout: float) -> list[Any] | None:
        """Its next message; None when none came within ``timeout`` s."""
        try:
            if self.conn.poll(timeout):
                return _read(self.conn)
        except EOFError:
            return ["failed", "it ended"]
        except (OSError, ValueError) as exc:
            return ["failed", f"its answer could not be read ({exc})"]
        return None

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10.0)
        self.conn.close()


class ProcessDevices:
    """The simulated devices of a job in ``processes`` child processes (device i in child
    i mod ``processes``): `prepare` starts them (they import while this one loads the data),
    `start` starts the devices, `stop` ends them."""

    def __init__(self, config: "SimulationConfig", processes: int = 1) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.config = config
        self.processes = min(processes, max(1, config.clients))
        self._children: list[_Child] = []
        self._preparing: threading.Thread | None = None
        self._prepare_failed: str | None = None

    def prepare(self) -> None:
        """Start the child processes on a thread of this process, which goes on meanwhile (a
        forked child comes once the fork server has imported torch); each waits for `start`."""
        self._preparing = threading.Thread(target=self._start_children, name="edgefl-devices-prepare", daemon=True)
        self._preparing.start()

    def _start_children(self) -> None:
        try:
            context = _start_context()
            for number in range(self.processes):
                self._children.append(_Child(context, number))
        except Exception as exc:  # `start` raises it
            self._prepare_failed = f"{type(exc).__name__}: {exc}"

    def _prepared(self) -> None:
        """Wait for `prepare`'s children (started now if it was not called)."""
        if self._preparing is None:
            self._start_children()
        else:
            self._preparing.join()
            self._preparing = None
        if self._prepare_failed is not None:
            self.close()
            raise ChildProcessError(f"the simulated devices' process did not start: {self._prepare_failed}")

    def start(self, url: str, trusted_keys: tuple[bytes, ...], shards_dir: str) -> dict[str, Any]:
        """Start the devices on the broker at ``url``, trusting models signed by ``trusted_keys``,
        with their data in ``shards_dir`` (blocking until they are connecting); where they run."""
        self._prepared()
        config_json = json.dumps(self.config.to_plain())
        failed: list[list[Any] | None] = []  # per child: why it could not be told to start (None: told)
        for number, child in enumerate(self._children):
            try:
                _send(child.conn, "start", config_json, url, self.config.threads or 1, [k.hex() for k in trusted_keys],
                      shards_dir, number, self.processes)  # its devices: number, number + processes, ...
                failed.append(None)
            except OSError as exc:
                failed.append(["failed", f"it ended ({exc})"])
        deadline = time.monotonic() + START_TIMEOUT_S
        replies = [why if why is not None else child.receive(max(0.0, deadline - time.monotonic()))
                   for why, child in zip(failed, self._children, strict=True)]
        for reply in replies:
            if reply is None or reply[0] != "started":
                self.close()
                why = reply[1] if reply is not None else f"no answer within {START_TIMEOUT_S:g} s"
                raise ChildProcessError(f"the simulated devices' process did not start: {why}")
        placed: dict[str, Any] = replies[0][1]  # type: ignore[index]
        if len(replies) > 1:
            placed["pids"] = [reply[1]["pid"] for reply in replies]  # type: ignore[index]
        return placed

    def stop(self, wait_s: float) -> None:
        """Tell the children to end their devices (a device inside a step gets ``wait_s`` to leave
        it) and wait for them to exit; killed if they do not."""
        live = []
        for child in self._children:
            try:
                _send(child.conn, "stop", wait_s)
                live.append(child)
            except OSError as exc:  # the child died: nothing to stop
                log.warning("a simulated devices' process ended early: %s", exc)
        deadline = time.monotonic() + wait_s + 30.0
        for child in live:
            reply = child.receive(max(0.0, deadline - time.monotonic()))
            for name in reply[1] if reply is not None and reply[0] == "stopped" else []:
                log.warning("device %s did not stop in time", name)
        for child in self._children:
            child.process.join(timeout=10.0)
        self.close()

    def close(self) -> None:
        """End the child processes still there (killed) — after `stop`, or instead of it."""
        if self._preparing is not None:  # those it is starting are ended too
            self._preparing.join()
            self._preparing = None
        children, self._children = self._children, []
        for child in children:
            child.close()
