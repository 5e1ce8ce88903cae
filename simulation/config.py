"""What `edgefl simulate` runs: the job's settings, the mixed home fleet, the public split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from edge_sdk.accelerator import check_device_name
from edge_sdk.data.datasets import ImageDataset
from edge_sdk.data.holdout import check_holdout
from edge_sdk.networking.link import LinkConfig
from edge_sdk.profiling import load_profile
from edge_sdk.throttle import MODES
from edge_sdk.train_config import available_cpus
from edge_sdk.training import TrainConfig, default_threads

from coordinator.core.asynchronous import check_async_method
from coordinator.runtime.sim_clock import PROFILES as OFFLINE_BY_PROFILE, SimClock
from coordinator.core.federation import FederationConfig
from coordinator.strategies import strategy_class

from simulation.defaults import SIMULATION
from simulation.device_ids import device_id
from simulation.backends import BACKENDS, LOCAL_BACKEND_UP_TO, devices_backend
from simulation.shared_connection import CONNECTIONS, OWN_CONNECTIONS_UP_TO

__all__ = ["SimulationConfig", "sim_federation", "STOP_AFTER_FAILED_ROUNDS", "DEFAULT_FLEET", "BACKENDS",
           "LOCAL_BACKEND_UP_TO",
           "MAX_DEVICES_PER_PROCESS", "split_public", "public_rows"]

#: The simulated devices with connections of their own (`--connections own`) one process hosts at
#: most: one file descriptor each, here and in the broker. Their connections share one network
#: thread on an epoll selector (edge_sdk/networking/network_loop.py; paho's own threads polled with select(),
#: which stopped at file descriptor 1024: about 200 devices). `--backend ray` spreads larger fleets
#: over processes; devices on shared connections have no such limit.
MAX_DEVICES_PER_PROCESS = 10_000


#: A mixed home fleet; devices take these profiles in turn.
DEFAULT_FLEET = ("raspberry-pi-3b", "raspberry-pi-4b", "raspberry-pi-5", "jetson-nano",
                 "jetson-orin-nano", "android-midrange", "laptop")


def default_device_processes() -> int:
    """The devices' child processes of `--backend process` unless told: two where this process may
    run on two CPUs or more, so that two of a round's devices train at once (10,000 devices x 6
    images on 2 cores: 0.127 and 0.113 -> 0.080 and 0.089 s a round; forked from one server, at the
    same peak PSS within the machine's spread; BENCHMARKS.md), else one."""
    return 2 if available_cpus() >= 2 else 1


@dataclass(frozen=True)
class SimulationConfig:
    """Settings of `edgefl simulate`."""

    method: str = SIMULATION.method
    clients: int = SIMULATION.clients
    dataset: str = SIMULATION.dataset
    data_root: str | None = None
    partition: str = SIMULATION.partition
    out: str = SIMULATION.out
    broker_url: str | None = None
    model: str = SIMULATION.model
    profiles: tuple[str, ...] = DEFAULT_FLEET
    throttle: str = SIMULATION.throttle  # virtual | sleep | off
    job: str = "sim"
    link: LinkConfig = field(default_factory=LinkConfig)
    plots: bool = True
    #: publish the job and its simulated devices to Home Assistant (MQTT discovery under this prefix,
    #: docs/homeassistant.md); None: off
    homeassistant: str | None = None
    options: dict[str, str] = field(default_factory=dict)  # method-specific, see each strategy
    public_fraction: float = 0.1  # training inputs held out as the public set, for methods that distil
    sim_device: str = SIMULATION.sim_device  # where simulated devices train: cpu, cuda, cuda:N, auto
    #: local: every device in this process; process: in one child process; ray: spread over Ray actors;
    #: auto: local up to `LOCAL_BACKEND_UP_TO` devices, process past that (`devices_backend`)
    backend: str = SIMULATION.backend
    connections: str = SIMULATION.connections  # own | shared | auto (`CONNECTIONS`)
    ray_address: str | None = None  # join this running Ray cluster (None: start one on this machine)
    ray_workers: int | None = None  # devices training at once (None: one per CPU of the cluster, at most clients)
    ray_cpus_per_worker: float = SIMULATION.ray_cpus_per_worker  # CPUs (and torch threads) of each training
    #: actor processes per worker: any free worker trains the next device
    ray_actors_per_worker: int = SIMULATION.ray_actors_per_worker
    #: `--backend process`: child processes hosting the devices (device i in child i mod N), each
    #: training one of its devices at a time: two train in parallel on two cores (issue 39).
    #: Default: 2 where this process may run on two CPUs or more, else 1 (`default_device_processes`)
    device_processes: int = field(default_factory=default_device_processes)
    #: torch threads of this process while the job runs: the local backend's device training and the
    #: coordinator's evaluation (Ray actors take ray_cpus_per_worker); None: leave torch's setting.
    #: Default: half of this machine's CPUs (`edge_sdk.training.default_threads`)
    threads: int | None = field(default_factory=default_threads)
    #: share of each device's data held out of training for federated evaluation (chosen by the sample's
    #: index in the dataset, as a real device chooses by its key); 0: none, and no federated evaluation
    holdout: float = SIMULATION.holdout
    #: the round loop's settings, the same `FederationConfig` `edgefl coordinator` reads from its TOML
    #: (`sim_federation`: with a simulation's defaults); a simulated job waits for all ``clients``
    #: (``min_devices`` is theirs) and evaluates where its devices train (``eval_device``: ``sim_device``)
    federation: FederationConfig = field(default_factory=lambda: sim_federation())
    #: the `TrainConfig` fields and options this job set itself; the model family's recipe
    #: (`edge_sdk.family_recipe`) fills the others. None: those that differ from their defaults
    #: (`chosen_settings`: a job built in Python); ``edgefl simulate`` names those on its command line
    chosen: tuple[str, ...] | None = None
    #: ``SHARE[:ONLINE[:PERIOD_S]]``: that share of the devices is online only ONLINE of every
    #: PERIOD_S simulated seconds (`coordinator.runtime.sim_clock`); None: every device always online
    offline: str | None = None
    #: a synchronous round's deadline in simulated seconds: later updates are dropped (None: none)
    sim_deadline_s: float | None = None

    @property
    def shared_connections(self) -> bool:
        """Whether the devices of a process share one MQTT connection (`connections`)."""
        return self.connections == "shared" or (self.connections == "auto" and self.clients > OWN_CONNECTIONS_UP_TO)

    def __post_init__(self) -> None:
        if type(self.clients) is not int or self.clients < 1:
            raise ValueError(f"clients must be an integer >= 1, got {self.clients!r}")
        if not isinstance(self.federation, FederationConfig):
            raise ValueError(f"federation must be a FederationConfig, got {type(self.federation).__name__}")
        if self.threads is not None and (type(self.threads) is not int or not 1 <= self.threads <= 1024):
            raise ValueError(f"threads must be an integer in 1..1024, got {self.threads!r}")
        k = self.federation.devices_per_round
        if k is not None and k > self.clients:
            raise ValueError(f"devices_per_round must be an integer in 1..clients ({self.clients}), got {k!r}")
        check_device_name(self.sim_device)  # syntax only: the run resolves it (torch, the GPU) where it is used
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.connections not in CONNECTIONS:
            raise ValueError(f"connections must be one of {', '.join(CONNECTIONS)}, got {self.connections!r}")
        one_process = self.devices_backend in ("local", "process")
        if one_process and self.clients > MAX_DEVICES_PER_PROCESS and not self.shared_connections:
            raise ValueError(f"one process hosts at most {MAX_DEVICES_PER_PROCESS} simulated devices with connections "
                             f"of their own; for {self.clients}, use --connections shared (or auto), or --backend ray, "
                             f"which spreads them over processes")
        if self.backend != "ray" and (self.ray_address is not None or self.ray_workers is not None):
            raise ValueError("ray_address and ray_workers need backend 'ray'")
        if self.ray_workers is not None and (type(self.ray_workers) is not int or self.ray_workers < 1):
            raise ValueError(f"ray_workers must be an integer >= 1, got {self.ray_workers!r}")
        if type(self.device_processes) is not int or self.device_processes < 1:
            raise ValueError(f"device_processes must be an integer >= 1, got {self.device_processes!r}")
        if type(self.ray_actors_per_worker) is not int or self.ray_actors_per_worker < 1:
            raise ValueError(f"ray_actors_per_worker must be an integer >= 1, got {self.ray_actors_per_worker!r}")
        if not (isinstance(self.ray_cpus_per_worker, (int, float)) and 0 < self.ray_cpus_per_worker <= 1024):
            raise ValueError(f"ray_cpus_per_worker must be a number of CPUs > 0, got {self.ray_cpus_per_worker!r}")
        if self.throttle not in MODES:
            raise ValueError(f"throttle must be one of {', '.join(MODES)}, got {self.throttle!r}")
        if not self.profiles:
            raise ValueError("profiles must name at least one device profile")
        if self.holdout != 0:
            check_holdout(self.holdout, "holdout")
        if self.federation.asynchronous:
            check_async_method(self.method)
        SimClock.from_text(self.federation.seed, self.offline, self.sim_deadline_s)  # a one-line error now
        if not 0 <= self.public_fraction < 1:
            raise ValueError(f"public_fraction must be in [0, 1), got {self.public_fraction!r}")

    @property
    def devices_backend(self) -> str:
        """Where the devices run: `backend`, with "auto" resolved by the fleet's size."""
        return devices_backend(self.backend, self.clients)

    def sim_clock(self) -> SimClock:
        """The simulated fleet's clock: its availability and synchronous deadline."""
        by_device = None
        if self.offline == OFFLINE_BY_PROFILE:  # each device as its profile's [availability] says
            shares = {name: load_profile(name).availability for name in set(self.profiles)}
            by_device = {device_id(i): (share.online_fraction, share.period_s) for i in range(self.clients)
                         if (share := shares[self.profiles[i % len(self.profiles)]]) is not None}
        return SimClock.from_text(self.federation.seed, self.offline, self.sim_deadline_s, by_device)

    def simulated_federation(self) -> FederationConfig:
        """The round loop's settings of this simulated job: ``federation`` waiting for every
        device and evaluating on ``sim_device``."""
        return replace(self.federation, min_devices=self.clients, eval_device=self.sim_device,
                       federated_eval=self.federation.federated_eval and self.holdout > 0)

    def to_plain(self) -> dict[str, Any]:
        """The settings as JSON-safe data (the report's config; what a Ray actor receives)."""
        data = asdict(self)
        data["link"] = {"chunk_size": self.link.chunk_size, "transfer_dtype": self.link.transfer_dtype}
        return data

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> "SimulationConfig":
        """The inverse of `to_plain` (validated like any construction)."""
        fed = data["federation"]
        federation = FederationConfig(**{**fed, "train": TrainConfig.from_dict(fed["train"]),
                                         "lr_decay": tuple((int(r), float(f)) for r, f in fed.get("lr_decay", ()))})
        return cls(**{**data, "federation": federation, "link": LinkConfig(**data["link"]),
                      "profiles": tuple(data["profiles"]),
                      "chosen": None if data.get("chosen") is None else tuple(data["chosen"])})


#: a simulated fleet fails alike every round (same code, same data): after this many rounds in
#: which every device failed its training, the job stops with the devices' error
STOP_AFTER_FAILED_ROUNDS = 3


#: A simulation publishes its final model to at most this many devices (the last round's first): a
#: real coordinator sends every device its model, ~0.5 MB each, which at 10,000 simulated devices
#: would be 5 GB through (and retained in) the broker for devices nobody asks to predict.
SIM_PUBLISH_DEVICES = 100


def sim_federation(**settings: Any) -> FederationConfig:
    """`FederationConfig` with a simulation's defaults: `SIMULATION.rounds` rounds, the job stops after
    :data:`STOP_AFTER_FAILED_ROUNDS` rounds in which every device failed, and the final model goes
    to at most :data:`SIM_PUBLISH_DEVICES` devices; ``settings`` override."""
    return FederationConfig(**{"rounds": SIMULATION.rounds, "stop_after_failed_rounds": STOP_AFTER_FAILED_ROUNDS,
                               "publish_devices": SIM_PUBLISH_DEVICES, **settings})



def split_public(config: SimulationConfig, dataset: ImageDataset) -> tuple[np.ndarray, np.ndarray | None]:
    """Indices of training samples the devices share out, and the public inputs held back.

    Only a method that distils (`needs_public_data`) gets a public set: a seeded,
    stratified `public_fraction` of the training split that no device ever holds.
    Its labels are dropped.
    """
    everything = np.arange(len(dataset.y_train))
    public = public_rows(config, dataset.y_train, dataset.num_classes)
    if public is None:
        return everything, None
    return np.setdiff1d(everything, public), dataset.x_train[public]


def public_rows(config: SimulationConfig, y_train: np.ndarray, num_classes: int) -> np.ndarray | None:
    """The rows of the training split (labels ``y_train``) held back as the public set, sorted;
    None for a method that does not distil."""
    if not strategy_class(config.method).needs_public_data:
        return None
    rng = np.random.default_rng(config.federation.seed + 7919)
    public = np.concatenate([
        rng.permutation(np.flatnonzero(y_train == c))[: int(round(config.public_fraction * np.sum(y_train == c)))]
        for c in range(num_classes)
    ])
    return np.sort(public)
