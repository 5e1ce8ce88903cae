"""`edgefl simulate --backend ray`: the simulated devices sharded over Ray actors.

Each actor is a process on some node of a Ray cluster that hosts many simulated devices
(`sim_devices.DeviceHost`), training one at a time with the actor's CPUs (its torch threads) or
a fraction of a GPU. The coordinator stays in this process, and every device still talks to it
only through the MQTT broker, so bytes, faults and validation are those of a real fleet.

What crosses Ray is plain data: the job's settings as JSON, the public key the devices trust
as hex and, back, lists of names. The devices' data is written once, in partition order, to a
folder the actors of this machine open memory-mapped (`DeviceShards`: one copy in the page cache,
whatever the number of actors); an actor on another node, where that folder is not, loads the
dataset itself (it must be on that node) and cuts the same shards. Ray itself is an optional extra:
``pip install 'edgefl[ray]'``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from simulation.config import MAX_DEVICES_PER_PROCESS

if TYPE_CHECKING:
    from simulation.config import SimulationConfig
    from simulation.device_shards import DeviceShards

__all__ = ["RayDevices", "DeviceActor"]

log = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray, which is not installed: pip install 'edgefl[ray]'") from None
    return ray


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def node_slot(slots: Any) -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """Hold one of the node's training slots (its `ComputeSlots` Ray actor) around a round,
    asking with how many of this actor's devices wait (the longest queue is served first)."""
    ray = _ray()

    @contextlib.contextmanager
    def held(waiting: int) -> Iterator[None]:
        ray.get(slots.acquire.remote(waiting))
        try:
            yield
        finally:
            slots.release.remote()

    return held


def build_shards(config: "SimulationConfig") -> "DeviceShards":
    """The devices' `DeviceShards`, from the dataset loaded here (an actor on a node without the
    driver's folder)."""
    from simulation.config import split_public
    from simulation.own_data import load_simulation_dataset
    from simulation.device_shards import DeviceShards

    dataset = load_simulation_dataset(config.dataset, root=config.data_root, seed=config.federation.seed,
                                      keep_raw_train=True)  # as the driver's: bytes, each device normalises its own
    private, _ = split_public(config, dataset)
    return DeviceShards.build(config, dataset, private)


class DeviceActor:
    """One Ray actor: a process hosting some of the simulated devices (made a Ray actor class
    by `RayDevices`; plain Python otherwise, so it can be tested without a cluster)."""

    def __init__(self, config_json: str, url: str, indices: list[int], threads: int,
                 trusted_keys: tuple[str, ...] = (), shards_dir: str | None = None) -> None:
        import torch

        from edge_sdk.training import warm_up_optimizer
        from simulation.config import SimulationConfig
        from simulation.device_shards import DeviceShards

        torch.set_num_threads(max(1, threads))
        warm_up_optimizer()  # the first round's optimizer, without its imports
        self.config = SimulationConfig.from_plain(json.loads(config_json))
        self.url = url
        self.indices = indices
        self.trusted_keys = tuple(bytes.fromhex(k) for k in trusted_keys)  # the job's public key(s), as hex
        #: the driver's machine: its saved shards, shared and memory-mapped; another node: loaded here
        self.mapped = shards_dir is not None and os.path.isdir(shards_dir)
        self.shards = DeviceShards.open(shards_dir) if self.mapped else build_shards(self.config)
        self.host: Any = None

    def node(self) -> str:
        """The Ray node this actor runs on ("local" outside Ray: a process that has not imported
        ray is not in Ray, and importing it to ask took 1.1 s of `--backend process`'s child,
        while its devices registered)."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
        return "local"

    def start(self, slots: Any = None) -> dict[str, Any]:
        """Start the devices, whose rounds this actor's training thread runs one at a time, each
        while holding one of ``slots`` (the node's `ComputeSlots` actor; None: no other limit);
        where they run, and whether their data is the driver's mapped copy or loaded here."""
        import threading

        from simulation.open_files import ensure_open_files
        from simulation.sim_devices import DeviceHost
        from simulation.training_queue import TrainingQueue

        if not self.config.shared_connections:
            ensure_open_files(len(self.indices))

        queue = TrainingQueue(None if slots is None else node_slot(slots))
        self.host = DeviceHost.create(self.config, self.url, self.shards, self.indices, queue,
                                      self.trusted_keys)
        threading.Thread(target=queue.serve_until_closed, name="training", daemon=True).start()
        self.host.start()
        return {"node": self.node(), "pid": os.getpid(), "torch_threads": torch_threads(),
                "data": "mapped" if self.mapped else "loaded", "devices": self.host.device_ids}

    def stop(self, wait_s: float) -> list[str]:
        """Wait up to ``wait_s`` for the devices to finish, stop the rest; the ones stuck."""
        return self.host.stop(wait_s) if self.host is not None else []


def _token_notice(record: logging.LogRecord) -> bool:
    """Drop Ray's notice that a local cluster uses token authentication (what edgefl wants: it is
    said once in the docs, not on every run); its warning that authentication is *off* stays."""
    return not record.getMessage().startswith("Token authentication is enabled")


class RayDevices:
    """The simulated devices of a job on Ray actors; `start` places them, `stop` ends them."""

    def __init__(self, config: "SimulationConfig", url: str, trusted_keys: tuple[bytes, ...] = (),
                 shards_dir: str | None = None) -> None:
        self.config = config
        self.shards_dir = shards_dir  # the devices' data, saved by `DeviceShards.save` (None: each actor loads it)
        self.url = url
        self.trusted_keys = trusted_keys  # raw public keys whose signed models the devices install
        self.actors: list[Any] = []
        self.slots: dict[str, Any] = {}  # node id -> its ComputeSlots actor
        #: per node, its slots and the most held at once (filled by `stop`)
        self.slot_stats: dict[str, dict[str, int]] = {}
        self._started_ray = False

    def start(self) -> list[dict[str, Any]]:
        """Connect to (or start) Ray, create the actors and start their devices; returns where
        each actor runs and which devices it hosts."""
        ray = _ray()
        config = self.config
        if not ray.is_initialized():
            logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_token_notice)
            try:
                ray.init(address=config.ray_address, include_dashboard=False, logging_level=logging.WARNING,
                         log_to_driver=log.isEnabledFor(logging.INFO), configure_logging=True)
            except ConnectionError as exc:
                hint = "" if os.environ.get("RAY_AUTH_MODE") else (
                    " (a cluster started with `ray start` uses token authentication: set RAY_AUTH_MODE=token)")
                raise ConnectionError(f"{str(exc).splitlines()[0]}{hint}") from None
            self._started_ray = True
        self._check_reachable(ray)
        cpus = float(ray.cluster_resources().get("CPU", 1))
        gpus = float(ray.cluster_resources().get("GPU", 0))
        needed = 1 if config.shared_connections else math.ceil(config.clients / MAX_DEVICES_PER_PROCESS)
        workers = config.ray_workers or max(1, min(config.clients, int(cpus // config.ray_cpus_per_worker)))
        share = min(config.ray_cpus_per_worker, cpus / workers)  # each training's CPUs (its torch threads)
        count = min(config.clients, max(needed, workers * config.ray_actors_per_worker))
        # the actors together reserve the workers' CPUs; the slots keep the trainings to `workers`
        options: dict[str, Any] = {"num_cpus": share * workers / count, "scheduling_strategy": "SPREAD"}
        if config.sim_device != "cpu":
            if gpus <= 0:
                raise ValueError(f"sim_device {config.sim_device!r}: the Ray cluster has no GPU")
            options["num_gpus"] = gpus / count
        actor_class = ray.remote(DeviceActor)
        text = json.dumps(config.to_plain())
        threads = max(1, int(share))
        parts = [part.tolist() for part in np.array_split(np.arange(config.clients), count)]
        keys = tuple(k.hex() for k in self.trusted_keys)
        self.actors = [actor_class.options(**options).remote(text, self.url, part, threads, keys, self.shards_dir)
                       for part in parts]
        nodes = ray.get([actor.node.remote() for actor in self.actors])
        self.slots = {node: self._slots(ray, node, max(1, round(workers * nodes.count(node) / count)))
                      for node in sorted(set(nodes))}
        placed = ray.get([actor.start.remote(self.slots[node]) for actor, node in zip(self.actors, nodes, strict=True)])
        log.info("%d devices on %d Ray actors over %d node(s), %d training at once", config.clients,
                 len(self.actors), len(self.slots), workers)
        return placed

    @staticmethod
    def _slots(ray: Any, node: str, slots: int) -> Any:
        """The `ComputeSlots` actor of ``node`` (no CPU of its own, on that node where it can)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from simulation.compute_slots import ComputeSlots

        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
        return ray.remote(ComputeSlots).options(num_cpus=0, scheduling_strategy=strategy).remote(slots)

    def stop(self, wait_s: float) -> None:
        """End every actor (after ``wait_s`` for its devices to finish) and, if this run
        started Ray, Ray itself."""
        if not self.actors:
            return self._shutdown()
        ray = _ray()
        try:
            stuck = ray.get([actor.stop.remote(wait_s) for actor in self.actors], timeout=wait_s + 30)
            for names in stuck:
                for name in names:
                    log.warning("device %s did not stop in time", name)
        except Exception as exc:  # an actor died or hung: it is killed below either way
            log.warning("Ray actors did not stop cleanly: %s", str(exc).splitlines()[0] if str(exc) else exc)
        finally:
            try:
                stats = ray.get([slots.stats.remote() for slots in self.slots.values()], timeout=30)
                self.slot_stats = dict(zip(self.slots, stats, strict=True))
            except Exception as exc:
                log.warning("the training slots did not answer: %s", str(exc).splitlines()[0] if str(exc) else exc)
            for actor in [*self.actors, *self.slots.values()]:
                ray.kill(actor)
            self.actors, self.slots = [], {}
            self._shutdown()

    def _shutdown(self) -> None:
        if self._started_ray:
            _ray().shutdown()
            self._started_ray = False

    def _check_reachable(self, ray: Any) -> None:
        """An embedded broker listens on loopback: devices on other machines cannot reach it."""
        if self.config.broker_url is not None:
            return
        here = ray.util.get_node_ip_address()
        others = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")} - {here})
        if others:
            raise ValueError(f"the Ray cluster has nodes on other machines ({', '.join(others)}), which cannot "
                             f"reach the embedded broker on this machine's loopback; pass --broker "
                             f"mqtt://HOST:PORT of a broker every node can reach")
