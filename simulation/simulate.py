"""A whole federated job on one machine: broker, coordinator and N devices.

Every device is a `DeviceClient` stepped by a host of a few threads (in this process, or in Ray
actor processes with `backend="ray"`; simulation/sim_devices.py) with its own MQTT connection, its
own private shard of a real dataset and a device profile, and trusts only the models signed by the
job's ephemeral key; its compute (the FLOPs of its training) and transfers (the bytes it really
sent) are timed at that profile's speed, so the report's
`seconds` are those of the profiled fleet, whatever this machine's speed or load.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.model_names import AUTO, default_family
from edge_sdk.data.datasets import ImageDataset
from edge_sdk.networking.fair_inbox import InboxLimits
from edge_sdk.paths import writable_dir
from edge_sdk.profiling import load_profile
from edge_sdk.signing import ModelSigner
from edge_sdk.training import torch_threads, warm_up_optimizer
from edge_sdk.networking.transport import TransportConfig

from coordinator.homeassistant import HomeAssistantConfig
from coordinator.runtime.broker import BrokerConfig, EmbeddedBroker
from coordinator.core.federation import EvalData
from coordinator.runtime.family_training import with_family_training
from coordinator.runtime.fleet import Fleet, FleetProgress
from coordinator.runtime.job import JobConnection, run_job
from coordinator.runtime.report import RoundRecord, RunReport, keep_previous_report
from coordinator.runtime.state import CHECKPOINT_FILE
from coordinator.runtime.task import Task
from coordinator.strategies import create_strategy
from coordinator.strategies.base import Strategy, StrategyContext

from simulation.own_data import load_simulation_dataset
from simulation.config import DEFAULT_FLEET, STOP_AFTER_FAILED_ROUNDS, SimulationConfig, sim_federation, split_public
from simulation.device_shards import DeviceOrder, DeviceShards
from simulation.long_lived import building_long_lived, freezing_registrations, job_lifetime
from simulation.process_devices import ProcessDevices
from simulation.ray_devices import RayDevices
from simulation.open_files import ensure_open_files
from simulation.sim_devices import DeviceHost

__all__ = ["SimulationConfig", "sim_federation", "DEFAULT_FLEET", "STOP_AFTER_FAILED_ROUNDS", "run_simulation",
           "build_strategy", "split_public"]

log = logging.getLogger(__name__)

def build_strategy(config: SimulationConfig, dataset: ImageDataset, public_data: np.ndarray | None) -> Strategy:
    """The coordinator strategy `config.method` names, with its model and public data."""
    return create_strategy(config.method, StrategyContext(
        federation=config.simulated_federation(), model_family=config.model, input_shape=dataset.input_shape,
        num_classes=dataset.num_classes, public_data=public_data, options=dict(config.options),
    ))


def run_simulation(config: SimulationConfig,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   on_progress: Callable[[FleetProgress], None] | None = None,
                   release_memory: bool = True) -> RunReport:
    """Run the job, write its report into `config.out`, and return the report; torch uses
    `config.threads` threads meanwhile.

    Ctrl-C (KeyboardInterrupt) stops the devices (training stops after its current step) and
    the broker, writes the report of the rounds finished so far, then propagates.

    ``release_memory``: give the job's objects back to the garbage collector at the end (a process
    that goes on, e.g. to run another job); False for a process that exits right after, which then
    ends without the collector walking every one of them (1.5 s at 10,000 devices).
    """
    with torch_threads(config.threads), job_lifetime(release_memory):
        return _run_simulation(config, on_round, on_progress)


def _run_simulation(config: SimulationConfig, on_round: Callable[[RoundRecord], None] | None,
                    on_progress: Callable[[FleetProgress], None] | None) -> RunReport:
    if config.devices_backend != "process":
        with _optimizer_warm_up():  # the devices train in this process: their first optimizer's imports meanwhile
            return _run(config, on_round, on_progress, None)
    child = ProcessDevices(config, config.device_processes)
    child.prepare()  # it imports while this process loads the data
    try:
        return _run(config, on_round, on_progress, child)
    finally:
        child.close()


@contextmanager
def _optimizer_warm_up() -> Iterator[None]:
    """`warm_up_optimizer` on a thread while the block runs; the block waits for it on the way out,
    so that a job ending early (a bad --out, Ctrl-C) never exits while torch is halfway through an
    import (that aborted the process: "terminate called without an active exception")."""
    thread = threading.Thread(target=warm_up_optimizer, name="edgefl-warm-up", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _run(config: SimulationConfig, on_round: Callable[[RoundRecord], None] | None,
         on_progress: Callable[[FleetProgress], None] | None, child: ProcessDevices | None) -> RunReport:
    """The job, its devices in ``child`` (`--backend process`) or where `config.devices_backend` says."""
    out = writable_dir(config.out, "--out")  # before any work: a job must not train and then fail to report
    homeassistant = _homeassistant(config)
    checkpoint_dir = config.federation.checkpoint_dir
    if checkpoint_dir is not None:
        writable_dir(checkpoint_dir, "--checkpoint-dir")
    if config.data_root is not None and not Path(config.data_root).expanduser().is_dir():
        raise ValueError(f"--data-root {config.data_root} is not a folder")
    shards: DeviceShards | None
    with building_long_lived():  # the data, the model and the imports meanwhile live for the job
        order = DeviceOrder(config)  # the training split stored device by device: each shard a slice of it
        dataset = load_simulation_dataset(config.dataset, root=config.data_root, seed=config.federation.seed,
                                          train_order=order,
                               keep_raw_train=True)  # uint8 images stay bytes: each device normalises its own
        for name in set(config.profiles):
            load_profile(name)  # a bad profile is an error now, not in a device thread
        resolve_device(config.sim_device)  # devices train and the coordinator evaluates there: no GPU is an error now
        if config.model == AUTO:  # the family the data's shape calls for, named as such from here on
            config = replace(config, model=default_family(dataset.input_shape, config.method))
        config, recipe = with_family_training(config)
        shards, public = order.split(dataset)  # every device's data, in one array
        if checkpoint_dir is not None:
            check_same_job(config)
        strategy = build_strategy(config, dataset, public)
    # the devices' images live in the shards from here on: the training split is not held twice
    dataset = replace(dataset, x_train=np.empty((0, *dataset.x_train.shape[1:]), np.float32),
                      y_train=np.empty(0, np.int64), train_rows=None)
    if checkpoint_dir is None or not (Path(checkpoint_dir) / CHECKPOINT_FILE).exists():
        keep_previous_report(out)
    if config.devices_backend != "ray" and not config.shared_connections:  # room for the devices' sockets, the broker's
        ensure_open_files(config.clients)
    broker = None if config.broker_url else EmbeddedBroker(sim_broker_config(config.clients))
    shards_dir: Path | None = None
    try:
        if config.devices_backend in ("ray", "process"):  # the processes of this machine map one saved copy
            shards_dir = Path(tempfile.mkdtemp(prefix=".device-shards-", dir=out))
            shards.save(shards_dir)
            shards = None  # not held here too
        if broker is not None:
            broker.start()
        url = config.broker_url or broker.url
        report = RunReport(method=config.method, config=_config_dict(config, strategy, url))
        report.config["family_recipe"] = recipe  # the settings the model family chose (none: {})
        signer = ModelSigner.generate()  # an ephemeral key: the simulated devices trust only it

        @contextmanager
        def simulated_devices(fleet: Fleet) -> Iterator[None]:
            """The devices run while the rounds do, and end when the job does (a device in the middle
            of a step gets 10 s to leave it when the job finished)."""
            devices: DeviceHost | RayDevices | ProcessDevices
            if child is not None:
                assert shards_dir is not None
                devices = child
                report.config["process"] = child.start(url, (signer.public_key,), str(shards_dir))
            elif shards_dir is not None:
                devices = RayDevices(config, url, trusted_keys=(signer.public_key,), shards_dir=str(shards_dir))
                report.config["ray"] = {"hosts": devices.start()}
            else:
                assert shards is not None
                devices = DeviceHost.create(config, url, shards, range(config.clients),
                                            trusted_keys=(signer.public_key,))
                if devices.queue is not None:  # the devices train on this thread while it waits for them
                    fleet.while_waiting = devices.queue.serve
                devices.start()
            finished = False
            try:
                if checkpoint_dir is not None:  # the job starts: its settings go beside its checkpoints
                    keep_job_settings(config)
                yield
                finished = True
            finally:
                devices.stop(wait_s=10.0 if finished else 0.0)
                if isinstance(devices, RayDevices):
                    report.config["ray"]["slots"] = devices.slot_stats

        # room in the coordinator's receive queue for every device's registration at once (the default,
        # 10,000 messages, dropped 3,060 of 100,000, whose retries came after the registration timeout)
        inbox = InboxLimits(max_messages=max(InboxLimits.max_messages, 2 * config.clients))
        connection = JobConnection(TransportConfig(url=url, client_id=f"{config.job}-coordinator", inbox=inbox),
                                   config.job,
                                   config.link, signer=signer,
                                   task=Task(tuple(dataset.input_shape), dataset.num_classes),
                                   homeassistant=homeassistant)
        return run_job(strategy, report, connection, config.out, beside=simulated_devices,
                       eval_data=EvalData(dataset.x_test, dataset.y_test), preprocessing=dataset.preprocessing,
                       on_round=on_round, on_progress=freezing_registrations(on_progress), plots=config.plots,
                       clock=config.sim_clock())
    finally:
        if broker is not None:
            broker.stop()
        if shards_dir is not None:
            shutil.rmtree(shards_dir, ignore_errors=True)


#: Messages the embedded broker queues for one client beyond those in flight, per simulated device.
QUEUED_PER_DEVICE = 4


def sim_broker_config(clients: int) -> BrokerConfig:
    """The embedded broker of a simulation: room in each client's queue for a message or a few from
    every device at once (mosquitto drops QoS 1 messages past ``max_queued_messages``, 1,000 by
    default: a coordinator slower than 10,000 registrations a moment, or a shared connection
    slower than their acks, lost some and the devices waited out a retry)."""
    return BrokerConfig(extra_config=(f"max_queued_messages {max(1000, QUEUED_PER_DEVICE * clients)}",))


def _homeassistant(config: SimulationConfig) -> HomeAssistantConfig:
    """`--homeassistant PREFIX`: Home Assistant's discovery under that prefix (its birth message on
    ``PREFIX/status``, as Home Assistant's default); off without it."""
    if config.homeassistant is None:
        return HomeAssistantConfig()
    try:
        return HomeAssistantConfig(enabled=True, prefix=config.homeassistant,
                                   birth_topic=f"{config.homeassistant}/status")
    except ValueError as exc:
        raise ValueError(str(exc).replace("[homeassistant] prefix", "--homeassistant")) from None


#: Settings a resumed job may change: where it runs and reports, and how many rounds it has.
RESUMABLE_CHANGES = ("rounds", "out", "broker_url", "plots", "homeassistant", "round_deadline_s", "sim_device",
                     "backend", "ray_address", "ray_workers", "ray_cpus_per_worker", "ray_actors_per_worker",
                     "device_processes", "checkpoint_dir", "job", "threads")
#: ...and in its training settings, how many torch threads train (where, not what).
RESUMABLE_TRAIN_CHANGES = ("threads",)
#: The job's settings, kept beside its checkpoint.
JOB_FILE = "simulation.json"


#: The shape of the stored job settings: 2 since edgefl 0.3 (`SimulationConfig` nests the round
#: loop's `FederationConfig`); the file of an older job has none.
JOB_FORMAT = 2


def _job_settings(config: SimulationConfig) -> dict[str, Any]:
    """The job's settings as stored: the simulation's and its federation's in one flat table."""
    plain = json.loads(json.dumps(config.to_plain()))  # tuples as lists, as they are stored
    return {"format": JOB_FORMAT, **plain.pop("federation"), **plain}


def check_same_job(config: SimulationConfig) -> None:
    """When the job's settings are beside its checkpoint already, check that ``config`` is the
    same job (only :data:`RESUMABLE_CHANGES` may differ); ValueError names the first difference.
    Writes nothing (`keep_job_settings` does, when the job starts)."""
    folder = Path(config.federation.checkpoint_dir or ".")
    path = folder / JOB_FILE
    mine = _job_settings(config)
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: unreadable ({exc}); remove the folder to start a new job") from None
        if not isinstance(stored, dict) or stored.get("format") != JOB_FORMAT:
            raise ValueError(f"the checkpoint in {folder} was written by an older edgefl (its {JOB_FILE} keeps the "
                             f"job's settings in another shape): resume it with that version, or use another "
                             f"--checkpoint-dir for a new job")
        for settings in (stored, mine):
            for key in RESUMABLE_TRAIN_CHANGES:
                settings.get("train", {}).pop(key, None)
        defaults = _job_settings(SimulationConfig())
        for key in sorted(set(stored) | set(mine)):
            if key not in stored and mine.get(key) == defaults.get(key):
                continue  # a setting added since the job began, at its default: the same job
            if key not in RESUMABLE_CHANGES and stored.get(key) != mine.get(key):
                raise ValueError(f"the checkpoint in {folder} is of another job ({key} was {stored.get(key)!r}, "
                                 f"now {mine.get(key)!r}); use another --checkpoint-dir for a new job")


def keep_job_settings(config: SimulationConfig) -> None:
    """Keep the job's settings beside its checkpoint, unless they are there already (a resumed
    job: `check_same_job` compared them)."""
    folder = Path(config.federation.checkpoint_dir or ".")
    path = folder / JOB_FILE
    if path.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_job_settings(config), indent=1))


def _config_dict(config: SimulationConfig, strategy: Strategy, url: str) -> dict[str, Any]:
    data = config.to_plain()
    data["broker_url"] = url
    data["devices_backend"] = config.devices_backend  # where "auto" put the devices
    data["method_config"] = strategy.method_config()
    return data
