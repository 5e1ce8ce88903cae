"""`edgefl simulate --backend ray`: the simulated devices sharded over Ray actors.

Each actor is a process on some node of a Ray cluster that hosts many simulated devices
(`sim_devices.DeviceHost`), training one at a time with the actor's CPUs (its torch threads) or
a fraction of a GPU. The coordinator stays in this process, and every device still talks to it
only through the MQTT broker, so bytes, faults and validation are those of a real fleet.

What crosses Ray is plain data: the job's settings as JSON and, back, lists of names. Each
actor loads the dataset itself (it must be on every node) and cuts the same shards as the
default backend would. Ray itself is an optional extra: ``pip install 'edgefl[ray]'``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from coordinator.sim_devices import MAX_DEVICES_PER_PROCESS

if TYPE_CHECKING:
    from coordinator.simulate import SimulationConfig

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


class DeviceActor:
    """One Ray actor: a process hosting some of the simulated devices (made a Ray actor class
    by `RayDevices`; plain Python otherwise, so it can be tested without a cluster)."""

    def __init__(self, config_json: str, url: str, indices: list[int], threads: int) -> None:
        import torch

        from edge_sdk.data import load_dataset

        from coordinator.sim_devices import DeviceHost
        from coordinator.simulate import SimulationConfig, split_public

        torch.set_num_threads(max(1, threads))
        config = SimulationConfig.from_plain(json.loads(config_json))
        dataset = load_dataset(config.dataset, root=config.data_root, seed=config.seed)
        private, _ = split_public(config, dataset)
        self.host = DeviceHost.create(config, url, dataset, private, indices)

    def start(self) -> dict[str, Any]:
        """Start the devices; where they run."""
        self.host.start()
        node = "local"
        try:
            import ray
            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return {"node": node, "pid": os.getpid(), "torch_threads": torch_threads(), "devices": self.host.device_ids}

    def stop(self, wait_s: float) -> list[str]:
        """Wait up to ``wait_s`` for the devices to finish, stop the rest; the ones stuck."""
        return self.host.stop(wait_s)


class RayDevices:
    """The simulated devices of a job on Ray actors; `start` places them, `stop` ends them."""

    def __init__(self, config: "SimulationConfig", url: str) -> None:
        self.config = config
        self.url = url
        self.actors: list[Any] = []
        self._started_ray = False

    def start(self) -> list[dict[str, Any]]:
        """Connect to (or start) Ray, create the actors and start their devices; returns where
        each actor runs and which devices it hosts."""
        ray = _ray()
        config = self.config
        if not ray.is_initialized():
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
        needed = math.ceil(config.clients / MAX_DEVICES_PER_PROCESS)
        if config.ray_workers is not None and config.ray_workers < needed:
            raise ValueError(f"{config.clients} devices need at least {needed} Ray workers "
                             f"({MAX_DEVICES_PER_PROCESS} per process), got ray_workers={config.ray_workers}")
        workers = config.ray_workers or max(needed, min(config.clients, int(cpus // config.ray_cpus_per_worker)))
        # more actors than the cluster's CPUs allow at that share: each gets a smaller share
        share = min(config.ray_cpus_per_worker, cpus / workers)
        options: dict[str, Any] = {"num_cpus": share, "scheduling_strategy": "SPREAD"}
        if config.sim_device != "cpu":
            if gpus <= 0:
                raise ValueError(f"sim_device {config.sim_device!r}: the Ray cluster has no GPU")
            options["num_gpus"] = gpus / workers
        actor_class = ray.remote(DeviceActor)
        text = json.dumps(config.to_plain())
        threads = max(1, int(share))
        shards = [part.tolist() for part in np.array_split(np.arange(config.clients), workers)]
        self.actors = [actor_class.options(**options).remote(text, self.url, part, threads) for part in shards]
        placed = ray.get([actor.start.remote() for actor in self.actors])
        nodes = {p["node"] for p in placed}
        log.info("%d devices on %d Ray actors over %d node(s)", config.clients, len(self.actors), len(nodes))
        return placed

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
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
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
