"""A whole federated job on one machine: broker, coordinator and N devices.

Every device is a thread with its own MQTT connection, its own private shard of
a real dataset and a device profile; its compute (the FLOPs of its training) and
transfers (the bytes it really sent) are timed at that profile's speed, so the report's
`seconds` are those of the profiled fleet, whatever this machine's speed or load.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data import ImageDataset, load_dataset
from edge_sdk.link import LinkConfig, MessageLink
from edge_sdk.methods import LocalData
from edge_sdk.partition import partition
from edge_sdk.profiling import DeviceProfile, load_profile
from edge_sdk.protocol.topics import Topics
from edge_sdk.throttle import MODES, Throttle
from edge_sdk.training import TrainConfig
from edge_sdk.transport import MqttTransport, TransportConfig

from coordinator.broker import EmbeddedBroker
from coordinator.fleet import Fleet, FleetProgress
from coordinator.report import RoundRecord, RunReport
from coordinator.strategies import create_strategy, strategy_class
from coordinator.strategy import EvalData, FederationConfig, Strategy, StrategyContext

__all__ = ["SimulationConfig", "DEFAULT_FLEET", "run_simulation", "build_strategy", "split_public"]

log = logging.getLogger(__name__)

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
    sim_device: str = "cpu"  # where simulated devices train: cpu, cuda, cuda:N, auto

    def __post_init__(self) -> None:
        for name, low in (("clients", 1), ("rounds", 1), ("publish_every", 0), ("eval_every", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        k = self.devices_per_round
        if k is not None and (type(k) is not int or not 1 <= k <= self.clients):
            raise ValueError(f"devices_per_round must be an integer in 1..clients ({self.clients}), got {k!r}")
        resolve_device(self.sim_device)
        if self.throttle not in MODES:
            raise ValueError(f"throttle must be one of {', '.join(MODES)}, got {self.throttle!r}")
        if not self.profiles:
            raise ValueError("profiles must name at least one device profile")
        if not 0 <= self.public_fraction < 1:
            raise ValueError(f"public_fraction must be in [0, 1), got {self.public_fraction!r}")


def build_strategy(config: SimulationConfig, dataset: ImageDataset, public_data: np.ndarray | None,
                   checkpoint_dir: str | None = None) -> Strategy:
    """The coordinator strategy `config.method` names, with its model, eval and public data."""
    federation = FederationConfig(
        rounds=config.rounds, min_devices=config.clients, quorum=0.5,
        round_deadline_s=config.round_deadline_s, seed=config.seed, train=config.train,
        checkpoint_dir=checkpoint_dir, publish_every=config.publish_every,
        devices_per_round=config.devices_per_round, eval_every=config.eval_every,
    )
    return create_strategy(config.method, StrategyContext(
        federation=federation, model_family=config.model, input_shape=dataset.input_shape,
        num_classes=dataset.num_classes, eval_data=EvalData(dataset.x_test, dataset.y_test),
        public_data=public_data, options=dict(config.options),
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


def compute_slot() -> threading.Lock | None:
    """What the simulated devices of one process share so that one trains at a time, with all
    of torch's threads (DeviceContext.compute_slot); bench/bench_sim.py compares with None."""
    return threading.Lock()


def _device_threads(config: SimulationConfig, url: str, dataset: ImageDataset, private: np.ndarray,
                    profiles: list[DeviceProfile]) -> list[tuple[DeviceClient, threading.Thread]]:
    shards = [private[s] for s in partition(dataset.y_train[private], config.clients, config.partition,
                                            seed=config.seed)]
    devices = []
    slot = compute_slot()
    for i, (shard, profile) in enumerate(zip(shards, profiles)):
        device_id = f"dev{i:03d}"
        client = DeviceClient(
            ClientConfig(device_id=device_id, transport=TransportConfig(url=url, client_id=f"{config.job}-{device_id}"),
                         job=config.job, link=config.link, register_retry_s=2.0, seed=config.seed + i,
                         state_dir=str(Path(config.out) / "devices" / device_id), device=config.sim_device),
            LocalData(dataset.x_train[shard], dataset.y_train[shard], dataset.num_classes),
            profile,
            Throttle(profile, mode=config.throttle),
            compute_slot=slot,
        )
        thread = threading.Thread(target=client.run, name=device_id, daemon=True)
        devices.append((client, thread))
    return devices


def run_simulation(config: SimulationConfig,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   on_progress: Callable[[FleetProgress], None] | None = None) -> RunReport:
    """Run the job, write its report into `config.out`, and return the report.

    Ctrl-C (KeyboardInterrupt) stops the devices (training stops after its current step) and
    the broker, writes the report of the rounds finished so far, then propagates.
    """
    dataset = load_dataset(config.dataset, root=config.data_root, seed=config.seed)
    profiles = [load_profile(config.profiles[i % len(config.profiles)]) for i in range(config.clients)]
    private, public = split_public(config, dataset)
    strategy = build_strategy(config, dataset, public)
    broker = None if config.broker_url else EmbeddedBroker()
    report: RunReport | None = None
    devices: list[tuple[DeviceClient, threading.Thread]] = []
    finished = False
    try:
        if broker is not None:
            broker.start()
        url = config.broker_url or broker.url
        report = RunReport(method=config.method, config=_config_dict(config, strategy, url))
        transport = MqttTransport(TransportConfig(url=url, client_id=f"{config.job}-coordinator"))
        transport.connect()
        try:
            fleet = Fleet(MessageLink(transport, config.link), Topics(job=config.job), on_progress=on_progress)
            fleet.start()
            devices = _device_threads(config, url, dataset, private, profiles)
            for _, thread in devices:
                thread.start()
            strategy.run(fleet, report, on_round=on_round)
            transport.wait_published(10.0)
            finished = True
        finally:
            _stop_devices(devices, wait_s=30.0 if finished else 0.0)
            transport.close()
    finally:
        if broker is not None:
            broker.stop()
        if report is not None:
            report.write_outcome(Path(config.out), finished, plots=config.plots, describe=strategy.describe_label)
    return report


def _stop_devices(devices: list[tuple[DeviceClient, threading.Thread]], wait_s: float) -> None:
    """Give the device threads ``wait_s`` to end (they stop when the coordinator says so), then
    stop the rest: training stops after its current step, so no thread is left inside torch."""
    end = time.monotonic() + wait_s
    for client, thread in devices:
        thread.join(timeout=max(0.0, end - time.monotonic()))
        if thread.is_alive():
            client.stop()
    for client, thread in devices:
        thread.join(timeout=10.0)
        if thread.is_alive():
            log.warning("device %s did not stop in time", thread.name)


def _config_dict(config: SimulationConfig, strategy: Strategy, url: str) -> dict[str, Any]:
    data = asdict(config)
    data["link"] = {"chunk_size": config.link.chunk_size, "transfer_dtype": config.link.transfer_dtype}
    data["broker_url"] = url
    data["method_config"] = strategy.method_config()
    return data
