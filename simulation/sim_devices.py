"""Simulated devices hosted by one process: `DeviceClient`s without a thread each, every one with
its own MQTT connection (driven, with all the others, by one `NetworkLoop` thread), private shard
and profile; a few worker threads step a device when a message for it arrives or a duty of its is
due; the torch part of their rounds runs on one thread of the process (a `TrainingQueue`), one
round at a time, with all of the process' torch threads.

`edgefl simulate` runs one host in its own process (the default backend) or one per Ray actor
(`simulation/ray_devices.py`); either way every device talks to the coordinator only over MQTT.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.networking.network_loop import NetworkLoop
from edge_sdk.profiling import load_profile
from edge_sdk.throttle import Throttle
from edge_sdk.networking.transport import TransportConfig

from simulation.device_ids import device_id
from simulation.device_shards import DeviceShards
from simulation.long_lived import FREEZE_EVERY, building_long_lived
from simulation.shared_connection import SharedConnection
from simulation.training_queue import TrainingQueue

if TYPE_CHECKING:
    from simulation.config import SimulationConfig

__all__ = ["training_queue", "build_clients", "host_connections"]


log = logging.getLogger(__name__)


def training_queue() -> TrainingQueue | None:
    """Where the simulated devices of one process run the torch part of their rounds: one
    thread, one round at a time (simulation/training_queue.py). bench/bench_sim.py compares with
    None: each device trains on the host's worker that stepped it (two at a time: `STEPPING`)."""
    return TrainingQueue()


#: The simulated fleet's heartbeats together: about this many status messages a second at most.
FLEET_HEARTBEATS_PER_S = 33.0


def sim_heartbeat_s(clients: int) -> float:
    """A simulated device's heartbeat: a real device's 30 s, longer in a fleet large enough that
    30 s would flood the broker (10,000 devices: 333 retained messages a second); presence (the
    will, the birth message, the roll call) does not depend on it."""
    return max(30.0, clients / FLEET_HEARTBEATS_PER_S)


def sim_keepalive_s(clients: int) -> int:
    """A simulated device's MQTT keep-alive: a real device's 30 s, longer in a large fleet (10,000
    devices at 30 s: 333 PINGREQs and PINGRESPs a second through one interpreter). The broker
    still sees a reset or closed connection at once; only a silent one is noticed later."""
    return int(max(30.0, clients / FLEET_HEARTBEATS_PER_S))


#: Registrations a simulated fleet's retries may send a second at most, all devices together.
FLEET_REGISTER_RETRIES_PER_S = 500.0


def sim_register_retry_s(clients: int) -> float:
    """How long a simulated device waits for its registration's ack before it registers again: 2 s,
    longer in a large fleet, whose registrations the coordinator takes a while to answer (10,000
    devices retrying every 2 s sent 5,000 registrations a second and never caught up)."""
    return max(2.0, clients / FLEET_REGISTER_RETRIES_PER_S)


def build_clients(config: "SimulationConfig", url: str, shards: DeviceShards,
                  indices: Sequence[int], queue: TrainingQueue | None,
                  trusted_keys: tuple[bytes, ...] = (), network: NetworkLoop | None = None,
                  shared: Sequence[SharedConnection] = ()) -> list[DeviceClient]:
    """The simulated devices ``indices`` of the job, each with its shard of ``shards`` (a view: the
    images are not copied), its profile and seed. They train on ``queue``'s thread (None: each on
    its own), install only models signed by one of ``trusted_keys`` (raw Ed25519 public keys;
    none: any model) and talk over ``shared`` — the k-th `DEVICES_PER_CONNECTION` of them over the
    k-th connection (none: each over a connection of its own)."""
    profiles = {name: load_profile(name) for name in set(config.profiles)}  # frozen: shared by devices
    keepalive = sim_keepalive_s(config.clients)
    clients = []
    for position, i in enumerate(indices):
        profile = profiles[config.profiles[i % len(config.profiles)]]
        name = device_id(i)
        clients.append(DeviceClient(
            ClientConfig(device_id=name, transport=TransportConfig(url=url, client_id=f"{config.job}-{name}",
                                                                   keepalive=keepalive),
                         job=config.job, link=config.link, register_retry_s=sim_register_retry_s(config.clients),
                         seed=config.federation.seed + i,
                         heartbeat_s=sim_heartbeat_s(config.clients),
                         state_dir=str(Path(config.out) / "devices" / name), device=config.sim_device,
                         connect_retry_s=30.0, trusted_keys=trusted_keys, holdout=config.holdout),
            shards.local_data(i),
            profile,
            Throttle(profile, mode=config.throttle),
            run_compute=None if queue is None else queue.run,
            network=network,
            connect_via=shared[position // DEVICES_PER_CONNECTION].channel if shared else None,
        ))
    return clients


#: Simulated devices per shared MQTT connection (`--connections shared`): mosquitto keeps one queue
#: per client, and one connection for 100,000 devices stalled it (the coordinator's acks waited
#: 30 s for the broker); each connection also has its own window of messages in flight.
DEVICES_PER_CONNECTION = 1_000

def host_connections(config: "SimulationConfig", url: str, indices: Sequence[int]
                     ) -> tuple[NetworkLoop, list[SharedConnection]]:
    """The network thread of a host of devices ``indices`` and, with `shared_connections`, the
    connections they share (not connected yet). The thread looks at every connection's keep-alive a
    tenth as often as it pings, so a shared connection pings at the devices' keep-alive too: with a
    real device's 30 s, 30 s looks at it let an idle one pass the broker's 1.5 × 30 s (a round where
    10,000 devices trained lost six connections, and each of their devices' plans came twice)."""
    keepalive = sim_keepalive_s(config.clients)
    network = NetworkLoop(name="edgefl-sim-network", misc_every_s=max(1.0, keepalive / 10))
    shared = []
    if config.shared_connections:
        for first in range(0, len(indices), DEVICES_PER_CONNECTION):
            shared.append(SharedConnection(
                TransportConfig(url=url, client_id=f"{config.job}-devices-{indices[first]}", keepalive=keepalive),
                network, presence=config.broker_url is not None))  # an embedded broker stops with the job
    return network, shared


#: A host's worker threads at most (a round's participants each hold one while they train).
MAX_WORKERS = 256
#: Devices of one host inside a step at once (training aside).
STEPPING = 2
#: A device's place in its host's schedule.
_IDLE, _RUNNING, _AGAIN, _DONE = range(4)


class DeviceHost:
    """Drives its devices without a thread each: a device is a `DeviceClient` whose `step` a
    few worker threads call when a message for it arrives (`SimHooks.on_ready`) or its next
    duty is due (a timer), so an idle device holds a socket, a timer and its objects, and no
    thread. Rounds wait in ``queue`` for the thread that serves it (None: each trains on the
    worker that stepped it). ``workers`` bounds how many devices are inside a step at once —
    training, or sleeping out a throttle (`--throttle sleep`) — so it is at least the devices
    that train in one round; ``connectors`` threads open the connections at start."""

    def __init__(self, clients: list[DeviceClient], queue: TrainingQueue | None = None,
                 network: NetworkLoop | None = None, workers: int = 4, connectors: int = 2,
                 stepping: int | None = STEPPING, shared: Sequence[SharedConnection] = ()) -> None:
        self.clients = clients
        self.queue = queue
        self.network = network  # drives the devices' connections (stopped with them)
        self.shared = list(shared)  # the connections the devices share (none: each has its own)
        self.reasons: dict[str, str] = {}  # why each device that ended did
        #: guards the devices' states, the counts and the start/stop flags (never taken by the
        #: network thread: it only puts into ``_ready``)
        self._cond = threading.Condition()
        self._state = [_IDLE] * len(clients)
        #: devices with work, in the order it came (a device may be in it twice; None: a worker ends)
        self._ready: queue_module.SimpleQueue[int | None] = queue_module.SimpleQueue()
        self._timer_cond = threading.Condition()  # guards the timers
        self._timers: list[tuple[float, int]] = []  # (due, device): a heap; stale entries skipped
        self._due = [float("inf")] * len(clients)
        self._done = 0
        self._closing = False
        self._next_open = 0
        self._opened = 0  # devices connected
        self._started = 0.0
        self._version: str | None = None  # the MQTT version the first device connected with
        #: devices inside a step at once, not counting those waiting for their training (None: any
        #: number): more than a couple only contend for the interpreter (and load the machine)
        self._stepping = None if stepping is None else threading.Semaphore(stepping)
        self._taking = None if stepping is None else threading.Semaphore(stepping)  # workers waiting for work
        self._newest_round = -1  # the latest round a device of this host heard announced
        self._holding: set[int] = set()  # devices that keep an update (each about the model's size)
        for index, client in enumerate(clients):
            client.sim.on_ready = functools.partial(self._notify, index)
            client.sim.on_round_start = self._round_started
            if self._stepping is not None and client.sim.run_compute is not None:
                client.sim.run_compute = self._waiting_out(client.sim.run_compute)
        self._workers = [threading.Thread(target=self._work, name=f"edgefl-sim-worker-{n}", daemon=True)
                         for n in range(max(1, min(workers, len(clients))))]
        self._connectors = [threading.Thread(target=self._open_devices, name=f"edgefl-sim-connect-{n}",
                                             daemon=True) for n in range(max(1, min(connectors, len(clients))))]
        self._timer = threading.Thread(target=self._time, name="edgefl-sim-timers", daemon=True)

    @classmethod
    def create(cls, config: "SimulationConfig", url: str, shards: DeviceShards,
               indices: Sequence[int], queue: TrainingQueue | None = None,
               trusted_keys: tuple[bytes, ...] = ()) -> "DeviceHost":
        """Devices ``indices`` of the job with their data in ``shards``, training on ``queue``
        (default: `training_queue()`), trusting models signed by ``trusted_keys``; enough workers
        for a round's participants."""
        queue = training_queue() if queue is None else queue
        network, shared = host_connections(config, url, indices)
        federation = config.federation
        busy = max(federation.devices_per_round or len(indices), federation.eval_devices or 0) + 2
        with building_long_lived():  # the devices live for the job
            clients = build_clients(config, url, shards, indices, queue, trusted_keys, network, shared)
        return cls(clients, queue,
                   network, workers=max(8, min(busy, MAX_WORKERS)),
                   stepping=None if config.throttle == "sleep" else STEPPING,  # a device sleeps inside its step
                   connectors=1 if shared else 2, shared=shared)

    @property
    def device_ids(self) -> list[str]:
        return [c.config.device_id for c in self.clients]

    def start(self) -> None:
        """Open the devices' connections (``connectors`` at a time; each device registers as
        soon as it is connected) and start serving them."""
        self._started = time.monotonic()
        for connection in self.shared:  # the devices join them as they open
            connection.connect()
        for thread in [*self._workers, self._timer, *self._connectors]:
            thread.start()

    # -- connecting ----------------------------------------------------------------
    def _open_devices(self) -> None:
        while True:
            with self._cond:  # the first device learns the broker's MQTT version; the others wait for it
                while self._next_open > 0 and self._version is None and not self._closing:
                    self._cond.wait(1.0)
                index, self._next_open = self._next_open, self._next_open + 1
                if index >= len(self.clients) or self._closing:
                    return
            client = self.clients[index]
            if (self._version is not None and client.config.transport.protocol == "auto"
                    and client.sim.connect_via is None):
                # the version the first device found: "auto" would probe each connection of its own
                # (MQTT 5 without a will, then again with it); a shared one was probed once
                client.config = replace(client.config, transport=replace(client.config.transport,
                                                                         protocol=self._version))
            try:
                client.open()
            except Exception as exc:  # one line, not a thread's traceback; the coordinator never hears of it
                log.error("device %s could not connect: %s", client.config.device_id, exc)
                self._end(index, f"could not connect: {exc}", opened=False)
            else:
                self._notify(index)  # its first step registers it
                with self._cond:
                    self._opened += 1
                    if self._opened % FREEZE_EVERY == 0:
                        gc.freeze()
                    if self._opened == len(self.clients):
                        log.info("%d devices connected in %.1f s", self._opened, time.monotonic() - self._started)
            if self._version is None:
                with self._cond:  # the others connect with the version the first one found
                    self._version = client.link.transport.protocol_version if client.link else "auto"
                    self._cond.notify_all()

    # -- scheduling ------------------------------------------------------------------
    def _notify(self, index: int) -> None:
        """Device ``index`` has work (a message came, or it was asked to stop): step it soon.
        Called from the network thread: takes no lock of the host's."""
        self._ready.put(index)

    def _time(self) -> None:
        """Hand each device to the workers when its next duty is due (the timer thread)."""
        with self._timer_cond:
            while not self._closing:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    due, index = heapq.heappop(self._timers)
                    if due == self._due[index]:  # else stepped since, and due at another time
                        self._ready.put(index)
                self._timer_cond.wait(min(self._timers[0][0] - now, 60.0) if self._timers else 60.0)

    def _round_started(self, rnd: int) -> None:
        """A device heard round ``rnd`` announced: the devices that keep an update of an earlier
        round drop it (a real device keeps its last one; 10,000 simulated devices that each trained
        once would keep the model 10,000 times). Each is stepped for it: an idle one is not otherwise."""
        with self._cond:
            if rnd <= self._newest_round:
                return
            self._newest_round = rnd
            holders, self._holding = self._holding, set()
        for index in holders:
            client = self.clients[index]
            client.sim.forget_updates_before = max(client.sim.forget_updates_before, rnd)
            self._ready.put(index)

    def _waiting_out(self, run_compute: Callable[[Callable[[], object]], object]
                     ) -> Callable[[Callable[[], object]], object]:
        """``run_compute`` that lets another device step while this one waits for its training."""
        assert self._stepping is not None
        stepping = self._stepping

        def run(work: Callable[[], object]) -> object:
            stepping.release()
            try:
                return run_compute(work)
            finally:
                stepping.acquire()
        return run

    def _next_ready(self) -> int | None:
        """The next device with work (None: the worker ends); at most ``stepping`` workers wait
        for one at once, so that a burst of messages (10,000 registrations' acks) wakes no more
        than that many threads, whatever the number of workers."""
        with self._taking if self._taking is not None else contextlib.nullcontext():
            return self._ready.get()

    def _work(self) -> None:
        while (index := self._next_ready()) is not None:
            with self._cond:
                state = self._state[index]
                if state in (_RUNNING, _AGAIN):  # another worker steps it: once more after that
                    self._state[index] = _AGAIN
                    continue
                if state == _DONE:
                    continue
                self._state[index] = _RUNNING
            client = self.clients[index]
            with self._stepping if self._stepping is not None else contextlib.nullcontext():
                try:
                    result = client.step()
                except Exception as exc:  # one line, not a thread's traceback; the coordinator sees it offline
                    log.error("device %s stopped: %s: %s", client.config.device_id, type(exc).__name__, exc)
                    result = f"failed: {type(exc).__name__}: {exc}"
                if isinstance(result, str):
                    self._end(index, result)
                    continue
            with self._cond:
                if client.holds_update:
                    self._holding.add(index)
                if self._closing and self._state[index] != _DONE:  # `stop` waits for it
                    self._mark_done(index, "the simulation ended")
                    continue
                again = self._state[index] == _AGAIN or result <= 0
                self._state[index] = _IDLE
            if again:
                self._ready.put(index)
                continue
            due = time.monotonic() + result
            with self._timer_cond:
                self._due[index] = due
                heapq.heappush(self._timers, (due, index))
                if self._timers[0][1] == index:  # sooner than the timer thread waits for
                    self._timer_cond.notify()

    def _end(self, index: int, reason: str, opened: bool = True) -> None:
        client = self.clients[index]
        if opened:
            client.finish(reason, wait_s=0.0)  # the host waits for every device's last words at once
        with self._cond:
            self._mark_done(index, reason)

    def _mark_done(self, index: int, reason: str) -> None:
        """Device ``index`` has ended, for ``reason`` (the caller holds ``_cond``)."""
        self._state[index] = _DONE
        self._done += 1
        self.reasons[self.clients[index].config.device_id] = reason
        self._cond.notify_all()

    def stop(self, wait_s: float) -> list[str]:
        """End every device at once, as if they lost power (`DeviceClient.abort`: the broker
        publishes their wills, so their presence reads "offline"); a device inside a step gets
        up to ``wait_s`` to leave it (training stops after its current step; rounds still queued
        are dropped). Returns those that did not leave their step in time."""
        started = time.monotonic()
        if self.queue is not None:
            self.queue.close()
        with self._cond:
            self._closing = True  # no more connections are opened
        with self._timer_cond:
            self._timer_cond.notify()
        for connector in self._connectors:
            connector.join(timeout=30.0)  # an open in progress ends within its connect timeout
        with self._cond:
            for index, client in enumerate(self.clients):
                if self._state[index] != _DONE:
                    client.abort()  # a device inside a step ends it soon: its step sees the stop
                if self._state[index] == _IDLE:
                    self._mark_done(index, "the simulation ended")
            deadline = time.monotonic() + max(wait_s, 0.1)
            while self._done < len(self.clients) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
        for _ in self._workers:
            self._ready.put(None)
        for worker in self._workers:
            worker.join(timeout=max(0.1, deadline - time.monotonic()))
        stuck = [c.config.device_id for i, c in enumerate(self.clients) if self._state[i] != _DONE]
        for name in stuck:
            log.warning("device %s did not stop in time", name)
        for connection in self.shared:  # the devices' wills (their aborts published them) reach the broker first
            if not connection.transport.wait_published(max(1.0, deadline - time.monotonic())):
                log.warning("the simulated devices' last statuses were not all acknowledged")
            connection.close()
        if self.network is not None:  # resets the connections it has not closed yet (aborted: no waiting for paho)
            self.network.stop()
        log.info("%d devices stopped in %.1f s", len(self.clients), time.monotonic() - started)
        return stuck
