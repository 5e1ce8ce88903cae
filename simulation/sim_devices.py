"""Simulated devices hosted by one process: a thread per `DeviceClient`, each with its own MQTT
connection, private shard and profile; the torch part of their rounds runs on one thread of the
process (a `TrainingQueue`), one round at a time, with all of the process' torch threads.

`edgefl simulate` runs one host in its own process (the default backend) or one per Ray actor
(`simulation/ray_devices.py`); either way every device talks to the coordinator only over MQTT.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data import ImageDataset
from edge_sdk.methods import LocalData
from edge_sdk.network_loop import NetworkLoop
from edge_sdk.partition import partition
from edge_sdk.profiling import load_profile
from edge_sdk.throttle import Throttle
from edge_sdk.transport import TransportConfig

from simulation.training_queue import TrainingQueue

if TYPE_CHECKING:
    from simulation.config import SimulationConfig

__all__ = ["training_queue", "device_id", "build_clients"]


log = logging.getLogger(__name__)


def training_queue() -> TrainingQueue | None:
    """Where the simulated devices of one process run the torch part of their rounds: one
    thread, one round at a time (simulation/training_queue.py). bench/bench_sim.py compares with
    None: every device training at once on its own thread."""
    return TrainingQueue()


#: The simulated fleet's heartbeats together: about this many status messages a second at most.
FLEET_HEARTBEATS_PER_S = 33.0


def sim_heartbeat_s(clients: int) -> float:
    """A simulated device's heartbeat: a real device's 30 s, longer in a fleet large enough that
    30 s would flood the broker (10,000 devices: 333 retained messages a second); presence (the
    will, the birth message, the roll call) does not depend on it."""
    return max(30.0, clients / FLEET_HEARTBEATS_PER_S)


#: Registrations a simulated fleet's retries may send a second at most, all devices together.
FLEET_REGISTER_RETRIES_PER_S = 500.0


def sim_register_retry_s(clients: int) -> float:
    """How long a simulated device waits for its registration's ack before it registers again: 2 s,
    longer in a large fleet, whose registrations the coordinator takes a while to answer (10,000
    devices retrying every 2 s sent 5,000 registrations a second and never caught up)."""
    return max(2.0, clients / FLEET_REGISTER_RETRIES_PER_S)


def device_id(index: int) -> str:
    return f"dev{index:03d}"


def build_clients(config: "SimulationConfig", url: str, dataset: ImageDataset, private: np.ndarray,
                  indices: Sequence[int], queue: TrainingQueue | None,
                  trusted_keys: tuple[bytes, ...] = (), network: NetworkLoop | None = None) -> list[DeviceClient]:
    """The simulated devices ``indices`` of the job: the same shards, profiles and seeds in
    whichever process builds them (the split depends only on the config and the dataset). They
    train on ``queue``'s thread (None: each on its own) and install only models signed by one of
    ``trusted_keys`` (raw Ed25519 public keys; none: any model)."""
    shards = partition(dataset.y_train[private], config.clients, config.partition, seed=config.federation.seed)
    profiles = {name: load_profile(name) for name in set(config.profiles)}  # frozen: shared by devices
    clients = []
    for i in indices:
        shard = private[shards[i]]
        profile = profiles[config.profiles[i % len(config.profiles)]]
        name = device_id(i)
        clients.append(DeviceClient(
            ClientConfig(device_id=name, transport=TransportConfig(url=url, client_id=f"{config.job}-{name}"),
                         job=config.job, link=config.link, register_retry_s=sim_register_retry_s(config.clients),
                         seed=config.federation.seed + i,
                         heartbeat_s=sim_heartbeat_s(config.clients),
                         state_dir=str(Path(config.out) / "devices" / name), device=config.sim_device,
                         connect_retry_s=30.0, trusted_keys=trusted_keys, holdout=config.holdout),
            LocalData(dataset.x_train[shard], dataset.y_train[shard], dataset.num_classes,
                      keys=shard.astype(np.uint64)),
            profile,
            Throttle(profile, mode=config.throttle),
            run_compute=None if queue is None else queue.run,
            network=network,
        ))
    return clients


class DeviceHost:
    """Runs its devices in threads until the coordinator says stop or `stop` is called; their
    rounds wait in ``queue`` for the thread that serves it (None: each trains on its own)."""

    def __init__(self, clients: list[DeviceClient], queue: TrainingQueue | None = None,
                 network: NetworkLoop | None = None) -> None:
        self.clients = clients
        self.queue = queue
        self.network = network  # drives the devices' connections (stopped with them)
        self.threads = [threading.Thread(target=self._serve, args=(c,), name=c.config.device_id, daemon=True)
                        for c in clients]

    @classmethod
    def create(cls, config: "SimulationConfig", url: str, dataset: ImageDataset, private: np.ndarray,
               indices: Sequence[int], queue: TrainingQueue | None = None,
               trusted_keys: tuple[bytes, ...] = ()) -> "DeviceHost":
        """Devices ``indices`` of the job, training on ``queue`` (default: `training_queue()`),
        trusting models signed by ``trusted_keys``."""
        queue = training_queue() if queue is None else queue
        network = NetworkLoop(name="edgefl-sim-network")  # one thread for every device's connection
        return cls(build_clients(config, url, dataset, private, indices, queue, trusted_keys, network), queue,
                   network)

    @property
    def device_ids(self) -> list[str]:
        return [c.config.device_id for c in self.clients]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()
            time.sleep(0.002)  # hundreds of devices connecting in the same instant time out

    @staticmethod
    def _serve(client: DeviceClient) -> None:
        try:
            client.run()
        except Exception as exc:  # one line, not a thread's traceback; the coordinator sees it offline
            log.error("device %s stopped: %s", client.config.device_id, exc)

    def stop(self, wait_s: float) -> list[str]:
        """Give the devices ``wait_s`` to end by themselves, then stop the rest (training stops
        after its current step, so no thread is left inside torch; rounds still queued are
        dropped, since nobody serves the queue any more). Returns those that did not stop in time."""
        if self.queue is not None:
            self.queue.close()
        end = time.monotonic() + wait_s
        for client, thread in zip(self.clients, self.threads, strict=True):  # one thread per client
            thread.join(timeout=max(0.0, end - time.monotonic()))
            if thread.is_alive():
                client.stop()
        stuck = []
        for thread in self.threads:
            thread.join(timeout=10.0)
            if thread.is_alive():
                log.warning("device %s did not stop in time", thread.name)
                stuck.append(thread.name)
        if self.network is not None:
            self.network.stop()
        return stuck
