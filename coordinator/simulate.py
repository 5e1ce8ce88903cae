"""A whole federated job on one machine: broker, coordinator and N devices.

Every device is a thread (in this process, or in Ray actor processes with `backend="ray"`)
with its own MQTT connection, its own private shard of a real dataset and a device profile,
and trusts only the models signed by the job's ephemeral key;
its compute (the FLOPs of its training) and
transfers (the bytes it really sent) are timed at that profile's speed, so the report's
`seconds` are those of the profiled fleet, whatever this machine's speed or load.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.data import ImageDataset, load_dataset
from edge_sdk.paths import writable_dir
from edge_sdk.link import LinkConfig, MessageLink
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.topics import Topics
from edge_sdk.signing import ModelSigner
from edge_sdk.throttle import MODES
from edge_sdk.training import TrainConfig, default_threads, torch_threads
from edge_sdk.transport import MqttTransport, TransportConfig

from coordinator.broker import EmbeddedBroker
from coordinator.fleet import Fleet, FleetProgress
from coordinator.lr_schedule import check_lr_decay
from coordinator.publish import attach_signer
from coordinator.ray_devices import RayDevices
from coordinator.report import RoundRecord, RunReport, keep_previous_report
from coordinator.state import CHECKPOINT_FILE
from coordinator.sim_devices import MAX_DEVICES_PER_PROCESS, DeviceHost
from coordinator.strategies import create_strategy, strategy_class
from coordinator.strategy import EvalData, FederationConfig, Strategy, StrategyContext

__all__ = ["SimulationConfig", "DEFAULT_FLEET", "run_simulation", "build_strategy", "split_public"]

log = logging.getLogger(__name__)

#: Where the simulated devices run (`--backend`).
BACKENDS = ("local", "ray")

#: A mixed home fleet; devices take these profiles in turn.
DEFAULT_FLEET = ("raspberry-pi-3b", "raspberry-pi-4b", "raspberry-pi-5", "jetson-nano",
                 "jetson-orin-nano", "android-midrange", "laptop")


@dataclass(frozen=True)
class SimulationConfig:
    """Settings of `edgefl simulate`."""

    method: str = "fedavg"
    clients: int = 4
    rounds: int = 3
    dataset: str = "mnist-sample"
    data_root: str | None = None
    partition: str = "iid"
    seed: int = 0
    out: str = "runs/latest"
    broker_url: str | None = None
    model: str = "cnn4"
    profiles: tuple[str, ...] = DEFAULT_FLEET
    throttle: str = "virtual"  # virtual | sleep | off
    train: TrainConfig = field(default_factory=TrainConfig)
    round_deadline_s: float = 600.0
    job: str = "sim"
    link: LinkConfig = field(default_factory=LinkConfig)
    plots: bool = True
    options: dict[str, str] = field(default_factory=dict)  # method-specific, see each strategy
    public_fraction: float = 0.1  # training inputs held out as the public set, for methods that distil
    publish_every: int = 0  # also send devices their model every this many rounds (0: after the last only)
    devices_per_round: int | None = None  # sample this many devices per round (None: all), as the papers do
    eval_every: int = 1  # evaluate after every this many rounds; the last round always
    eval_samples: int | None = None  # interim evaluations on this many held-out samples; the last on all
    lr_decay: tuple[tuple[int, float], ...] = ()  # ((round, factor), ...): after `round` rounds, lr × factor
    sim_device: str = "cpu"  # where simulated devices train: cpu, cuda, cuda:N, auto
    backend: str = "local"  # local: every device in this process; ray: spread over Ray actors
    ray_address: str | None = None  # join this running Ray cluster (None: start one on this machine)
    ray_workers: int | None = None  # devices training at once (None: one per CPU of the cluster, at most clients)
    ray_cpus_per_worker: float = 1.0  # CPUs (and torch threads) of each training
    ray_actors_per_worker: int = 2  # actor processes per worker: any free worker trains the next device
    checkpoint_dir: str | None = None  # save the job's state after every round; the same job resumes there
    #: torch threads of this process while the job runs: the local backend's device training and the
    #: coordinator's evaluation (Ray actors take ray_cpus_per_worker); None: leave torch's setting.
    #: Default: half of this machine's CPUs (`edge_sdk.training.default_threads`)
    threads: int | None = field(default_factory=default_threads)

    def __post_init__(self) -> None:
        for name, low in (("clients", 1), ("rounds", 1), ("publish_every", 0), ("eval_every", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.threads is not None and (type(self.threads) is not int or not 1 <= self.threads <= 1024):
            raise ValueError(f"threads must be an integer in 1..1024, got {self.threads!r}")
        if self.eval_samples is not None and (type(self.eval_samples) is not int or self.eval_samples < 1):
            raise ValueError(f"eval_samples must be an integer >= 1, got {self.eval_samples!r}")
        k = self.devices_per_round
        if k is not None and (type(k) is not int or not 1 <= k <= self.clients):
            raise ValueError(f"devices_per_round must be an integer in 1..clients ({self.clients}), got {k!r}")
        resolve_device(self.sim_device)
        object.__setattr__(self, "lr_decay", check_lr_decay(self.lr_decay))
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "local" and self.clients > MAX_DEVICES_PER_PROCESS:
            raise ValueError(f"one process hosts at most {MAX_DEVICES_PER_PROCESS} simulated devices (paho-mqtt "
                             f"polls sockets with select(), which stops at 1024 file descriptors); for "
                             f"{self.clients}, use --backend ray, which spreads them over processes")
        if self.backend != "ray" and (self.ray_address is not None or self.ray_workers is not None):
            raise ValueError("ray_address and ray_workers need backend 'ray'")
        if self.ray_workers is not None and (type(self.ray_workers) is not int or self.ray_workers < 1):
            raise ValueError(f"ray_workers must be an integer >= 1, got {self.ray_workers!r}")
        if type(self.ray_actors_per_worker) is not int or self.ray_actors_per_worker < 1:
            raise ValueError(f"ray_actors_per_worker must be an integer >= 1, got {self.ray_actors_per_worker!r}")
        if not (isinstance(self.ray_cpus_per_worker, (int, float)) and 0 < self.ray_cpus_per_worker <= 1024):
            raise ValueError(f"ray_cpus_per_worker must be a number of CPUs > 0, got {self.ray_cpus_per_worker!r}")
        if self.throttle not in MODES:
            raise ValueError(f"throttle must be one of {', '.join(MODES)}, got {self.throttle!r}")
        if not self.profiles:
            raise ValueError("profiles must name at least one device profile")
        if not 0 <= self.public_fraction < 1:
            raise ValueError(f"public_fraction must be in [0, 1), got {self.public_fraction!r}")


    def to_plain(self) -> dict[str, Any]:
        """The settings as JSON-safe data (the report's config; what a Ray actor receives)."""
        data = asdict(self)
        data["link"] = {"chunk_size": self.link.chunk_size, "transfer_dtype": self.link.transfer_dtype}
        return data

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> "SimulationConfig":
        """The inverse of `to_plain` (validated like any construction)."""
        return cls(**{**data, "train": TrainConfig.from_dict(data["train"]), "link": LinkConfig(**data["link"]),
                      "profiles": tuple(data["profiles"]),
                      "lr_decay": tuple((int(r), float(f)) for r, f in data.get("lr_decay", ()))})


#: a simulated fleet fails alike every round (same code, same data): after this many rounds in
#: which every device failed its training, the job stops with the devices' error
STOP_AFTER_FAILED_ROUNDS = 3


def build_strategy(config: SimulationConfig, dataset: ImageDataset, public_data: np.ndarray | None,
                   checkpoint_dir: str | None = None) -> Strategy:
    """The coordinator strategy `config.method` names, with its model, eval and public data."""
    federation = FederationConfig(
        rounds=config.rounds, min_devices=config.clients, quorum=0.5,
        round_deadline_s=config.round_deadline_s, seed=config.seed, train=config.train,
        checkpoint_dir=checkpoint_dir, publish_every=config.publish_every,
        devices_per_round=config.devices_per_round, eval_every=config.eval_every, lr_decay=config.lr_decay,
        eval_samples=config.eval_samples, eval_device=config.sim_device,
        stop_after_failed_rounds=STOP_AFTER_FAILED_ROUNDS,
    )
    return create_strategy(config.method, StrategyContext(
        federation=federation, model_family=config.model, input_shape=dataset.input_shape,
        num_classes=dataset.num_classes, eval_data=EvalData(dataset.x_test, dataset.y_test),
        public_data=public_data, options=dict(config.options), preprocessing=dataset.preprocessing,
    ))


def split_public(config: SimulationConfig, dataset: ImageDataset) -> tuple[np.ndarray, np.ndarray | None]:
    """Indices of training samples the devices share out, and the public inputs held back.

    Only a method that distils (`needs_public_data`) gets a public set: a seeded,
    stratified `public_fraction` of the training split that no device ever holds.
    Its labels are dropped.
    """
    everything = np.arange(len(dataset.y_train))
    if not strategy_class(config.method).needs_public_data:
        return everything, None
    rng = np.random.default_rng(config.seed + 7919)
    public = np.concatenate([
        rng.permutation(np.flatnonzero(dataset.y_train == c))[: int(round(config.public_fraction * np.sum(dataset.y_train == c)))]
        for c in range(dataset.num_classes)
    ])
    private = np.setdiff1d(everything, public)
    return private, dataset.x_train[np.sort(public)]


def run_simulation(config: SimulationConfig,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   on_progress: Callable[[FleetProgress], None] | None = None) -> RunReport:
    """Run the job, write its report into `config.out`, and return the report; torch uses
    `config.threads` threads meanwhile.

    Ctrl-C (KeyboardInterrupt) stops the devices (training stops after its current step) and
    the broker, writes the report of the rounds finished so far, then propagates.
    """
    with torch_threads(config.threads):
        return _run_simulation(config, on_round, on_progress)


def _run_simulation(config: SimulationConfig, on_round: Callable[[RoundRecord], None] | None,
                    on_progress: Callable[[FleetProgress], None] | None) -> RunReport:
    out = writable_dir(config.out, "--out")  # before any work: a job must not train and then fail to report
    if config.checkpoint_dir is not None:
        writable_dir(config.checkpoint_dir, "--checkpoint-dir")
    if config.data_root is not None and not Path(config.data_root).expanduser().is_dir():
        raise ValueError(f"--data-root {config.data_root} is not a folder")
    dataset = load_dataset(config.dataset, root=config.data_root, seed=config.seed)
    for name in set(config.profiles):
        load_profile(name)  # a bad profile is an error now, not in a device thread
    private, public = split_public(config, dataset)
    if config.checkpoint_dir is not None:
        check_same_job(config)
    strategy = build_strategy(config, dataset, public, checkpoint_dir=config.checkpoint_dir)
    if config.checkpoint_dir is None or not (Path(config.checkpoint_dir) / CHECKPOINT_FILE).exists():
        keep_previous_report(out)
    broker = None if config.broker_url else EmbeddedBroker()
    report: RunReport | None = None
    devices: DeviceHost | RayDevices | None = None
    finished = False
    try:
        if broker is not None:
            broker.start()
        url = config.broker_url or broker.url
        report = RunReport(method=config.method, config=_config_dict(config, strategy, url))
        transport = MqttTransport(TransportConfig(url=url, client_id=f"{config.job}-coordinator"))
        transport.connect()
        signer = ModelSigner.generate()  # an ephemeral key: the simulated devices trust only it
        try:
            fleet = Fleet(MessageLink(transport, config.link), Topics(job=config.job), on_progress=on_progress,
                          method=strategy.device_part())
            attach_signer(fleet, signer)
            fleet.start()
            if config.backend == "ray":
                devices = RayDevices(config, url, trusted_keys=(signer.public_key,))
                report.config["ray"] = {"hosts": devices.start()}
            else:
                devices = DeviceHost.create(config, url, dataset, private, range(config.clients),
                                            trusted_keys=(signer.public_key,))
                if devices.queue is not None:  # the devices train on this thread while it waits for them
                    fleet.while_waiting = devices.queue.serve
                devices.start()
            strategy.run(fleet, report, on_round=on_round)
            transport.wait_published(10.0)
            finished = True
        finally:
            if devices is not None:
                devices.stop(wait_s=30.0 if finished else 0.0)
                if isinstance(devices, RayDevices):
                    report.config["ray"]["slots"] = devices.slot_stats
            transport.close()
    finally:
        if broker is not None:
            broker.stop()
        if report is not None:
            report.write_outcome(Path(config.out), finished, plots=config.plots, describe=strategy.describe_label)
    return report


#: Settings a resumed job may change: where it runs and reports, and how many rounds it has.
RESUMABLE_CHANGES = ("rounds", "out", "broker_url", "plots", "round_deadline_s", "sim_device", "backend",
                     "ray_address", "ray_workers", "ray_cpus_per_worker", "ray_actors_per_worker", "checkpoint_dir",
                     "job", "threads")
#: ...and in its training settings, how many torch threads train (where, not what).
RESUMABLE_TRAIN_CHANGES = ("threads",)
#: The job's settings, kept beside its checkpoint.
JOB_FILE = "simulation.json"


def check_same_job(config: SimulationConfig) -> None:
    """Keep the job's settings beside its checkpoint, or, when they are there already, check that
    ``config`` is the same job (only :data:`RESUMABLE_CHANGES` may differ); ValueError names the
    first difference."""
    folder = Path(config.checkpoint_dir or ".")
    path = folder / JOB_FILE
    mine = json.loads(json.dumps(config.to_plain()))  # tuples as lists, as they were stored
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: unreadable ({exc}); remove the folder to start a new job") from None
        for settings in (stored, mine):
            for key in RESUMABLE_TRAIN_CHANGES:
                settings.get("train", {}).pop(key, None)
        for key in sorted(set(stored) | set(mine)):
            if key not in RESUMABLE_CHANGES and stored.get(key) != mine.get(key):
                raise ValueError(f"the checkpoint in {folder} is of another job ({key} was {stored.get(key)!r}, "
                                 f"now {mine.get(key)!r}); use another --checkpoint-dir for a new job")
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=1))


def _config_dict(config: SimulationConfig, strategy: Strategy, url: str) -> dict[str, Any]:
    data = config.to_plain()
    data["broker_url"] = url
    data["method_config"] = strategy.method_config()
    return data
