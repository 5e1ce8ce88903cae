"""A coordinator for a real fleet on an external broker, configured by TOML."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.config import in_file, link_from_toml, read_toml, section, setting, transport_from_toml
from edge_sdk.methods.registry import METHODS
from edge_sdk.model_names import AUTO, default_family
from edge_sdk.methods.settings.options import check_options
from edge_sdk.data.datasets import ImageDataset, load_dataset
from edge_sdk.networking.link import LinkConfig
from edge_sdk.paths import writable_dir
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.signing import ModelSigner
from edge_sdk.networking.transport import TransportConfig

from coordinator.homeassistant import HomeAssistantConfig, homeassistant_from_toml
from coordinator.core.asynchronous import check_async_method
from coordinator.runtime.device_budgets import FleetLimits
from coordinator.core.federation import EvalData, FederationConfig, federation_from_toml
from coordinator.runtime.family_training import with_family_training
from coordinator.runtime.fleet import FleetProgress
from coordinator.runtime.job import JobConnection, run_job
from coordinator.runtime.job_identity import refuse_another_job, job_identity
from coordinator.runtime.report import RoundRecord, RunReport
from coordinator.runtime.state import load_checkpoint
from coordinator.runtime.task import Task
from coordinator.strategies import create_strategy, strategy_class
from coordinator.strategies.base import StrategyContext

__all__ = ["CoordinatorConfig", "coordinator_config_from_toml", "run_coordinator"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_TOP_KEYS = {"method", "job", "out", "model", "dataset", "data_root", "public_dataset", "broker", "federation",
             "train", "link", "options", "security", "limits", "task",
             "homeassistant", "removed_devices"}
_LIMIT_KEYS = set(FleetLimits.__dataclass_fields__)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of `edgefl coordinator`."""

    method: str = "fedavg"
    job: str = "default"
    out: str = "runs/coordinator"
    model: str = AUTO  # the task's shape decides (`edge_sdk.model_names.default_family`)
    #: held-out data the coordinator evaluates on (None: none; the task then comes from `[task]` alone)
    dataset: str | None = None
    data_root: str | None = None
    public_dataset: str | None = None  # unlabeled inputs for methods that distil (their training split)
    options: dict[str, str] = field(default_factory=dict)
    transport: TransportConfig = field(default_factory=lambda: TransportConfig(client_id="edgefl-coordinator"))
    federation: FederationConfig = field(default_factory=FederationConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    #: ``[task] mean = std = "fleet"``: the job's normalisation from the devices' statistics before
    #: round 1 (docs/sensor-data.md), frozen in the checkpoint
    fleet_normalisation: bool = False
    #: PEM (PKCS8) Ed25519 private key that signs published models (None: they go out unsigned)
    signing_key: str | None = None
    #: what one device may cost the coordinator (`[limits]`; docs/protocol.md §11)
    limits: FleetLimits = field(default_factory=FleetLimits)
    #: `[task]`: the job's input normalisation (mean, std per channel, raw scale) and class names;
    #: None: the evaluation dataset's training statistics and names
    task: Preprocessing | None = None
    #: `[task]` input_shape and num_classes (or the number of classes named): what the job learns; a
    #: device whose data is of another task is refused. None: the evaluation dataset's
    task_shape: Task | None = None
    #: `[homeassistant]`: the job and its devices in Home Assistant (docs/homeassistant.md); off by default
    homeassistant: HomeAssistantConfig = field(default_factory=HomeAssistantConfig)
    #: the file deploy/homeserver/remove-device.sh appends a removed device's id to: the device is
    #: taken out of the job (and cleared from Home Assistant); None: not watched
    removed_devices: str | None = None
    #: the `[train]` keys and `[options]` the TOML set; the model family's recipe
    #: (`edge_sdk.family_recipe`) fills the others. None: those that differ from their defaults
    chosen: tuple[str, ...] | None = None


def coordinator_config_from_toml(path: str | Path) -> CoordinatorConfig:
    """Parse a coordinator TOML file (example: deploy/coordinator.toml); every error in it is one
    line that names the file and the key."""
    config = read_toml(path)
    try:
        return _config_from(config, path)
    except (ValueError, TypeError, OSError) as exc:
        raise in_file(path, exc) from None


def _config_from(config: dict, path: str | Path) -> CoordinatorConfig:
    unknown = set(config) - _TOP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    job = setting(config, "job", str, "default")
    signing_key = section(config, "security", {"signing_key"}).get("signing_key")
    if signing_key is not None and not (isinstance(signing_key, str) and signing_key):
        raise ValueError(f"{path}: [security] signing_key must be the path of a PEM private key file")
    method = setting(config, "method", str, "fedavg")
    if method not in METHODS:
        raise ValueError(f"method = {method!r} is not a method; choose from {', '.join(sorted(METHODS))}")
    options = {str(k): str(v) for k, v in section(config, "options", set(config.get("options", {}))).items()}
    _in_table("options", lambda: check_options(METHODS[method].settings, method, options))
    federation = federation_from_toml(config)
    if federation.asynchronous:
        check_async_method(method)
    return CoordinatorConfig(
        method=method, job=job, out=setting(config, "out", str, "runs/coordinator"),
        model=setting(config, "model", str, AUTO), dataset=setting(config, "dataset", str),
        data_root=setting(config, "data_root", str), public_dataset=setting(config, "public_dataset", str),
        options=options,
        transport=transport_from_toml(config, client_id=f"edgefl-coordinator-{job}"),
        federation=federation,
        link=link_from_toml(config),
        signing_key=signing_key,
        limits=_in_table("limits", lambda: FleetLimits(**section(config, "limits", _LIMIT_KEYS))),
        homeassistant=homeassistant_from_toml(config),
        removed_devices=setting(config, "removed_devices", str),
        chosen=tuple(sorted({*config.get("train", {}), *options})),
        **_task(path, config),
    )


def _in_table(name: str, build: Callable[[], T]) -> T:
    """``build()``, its ValueError naming the table ``[name]``."""
    try:
        return build()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"[{name}] {exc}") from None


_TASK_KEYS = {"mean", "std", "classes", "input_shape", "num_classes", "resample", "repeat"}
#: `[task] mean` and `std` that ask the devices for their statistics
FLEET = "fleet"


def _task(path: str | Path, config: dict) -> dict[str, Any]:
    """The `[task]` table, read once: ``task`` (its normalisation) and ``task_shape`` (what the job
    learns) of `CoordinatorConfig`."""
    table = section(config, "task", _TASK_KEYS)
    fleet = FLEET in (table.get("mean"), table.get("std"))
    if fleet:
        if table.get("mean") != FLEET or table.get("std") != FLEET:
            raise ValueError(f"{path}: [task] mean and std are both \"fleet\" (the devices' statistics) or both "
                             "numbers")
        if "dataset" in config:
            raise ValueError(f"{path}: [task] mean = \"fleet\" is for a coordinator without a dataset (with one, "
                             "its training statistics normalise the job); remove one of them")
        shape = setting(table, "input_shape", list, None, "[task]")
        if not shape:
            raise ValueError(f"{path}: [task] mean = \"fleet\" needs input_shape (its channels)")
        table = {**table, "mean": [0.0] * int(shape[0]), "std": [1.0] * int(shape[0])}  # replaced before round 1
    return {"task": _task_normalisation(path, table), "task_shape": _task_shape(table, "dataset" in config),
            "fleet_normalisation": fleet}


def _task_normalisation(path: str | Path, task: dict) -> Preprocessing | None:
    """`[task]` ``mean`` and ``std`` (one number per input channel, in the devices' raw value scale)
    and optional ``classes`` (a name per class); None when it names none."""
    normalisation = {k: v for k, v in task.items() if k in ("mean", "std", "classes", "resample", "repeat")}
    if not normalisation:  # input_shape / num_classes only: the dataset's normalisation
        return None
    if "input_shape" in task:
        normalisation["input_shape"] = task["input_shape"]
    try:
        return Preprocessing.from_dict(normalisation)
    except ValueError as exc:
        raise ValueError(f"{path}: [task] {exc}") from None


def _task_shape(task: dict, has_dataset: bool) -> Task | None:
    """`[task]` ``input_shape`` and ``num_classes`` (else the number of ``classes`` named); None when
    the table says neither; without a dataset both are needed, with mean and std (one line)."""
    shape = setting(task, "input_shape", list, None, "[task]")
    classes = setting(task, "classes", list, None, "[task]")
    count = setting(task, "num_classes", int, len(classes) if classes else None, "[task]")
    if classes and count != len(classes):
        raise ValueError(f"[task] num_classes = {count} but classes names {len(classes)}")
    if not has_dataset:
        missing = [key for key, value in (("input_shape", shape), ("num_classes (or classes)", count),
                                          ("mean", task.get("mean")), ("std", task.get("std"))) if value is None]
        if missing:
            raise ValueError(f"without dataset = \"...\" (held-out data) the task comes from [task] alone: it needs "
                             f"{', '.join(missing)}")
    if shape is None and "num_classes" not in task:  # class names alone name the dataset's classes
        return None
    if shape is None or count is None:
        raise ValueError(f"[task] needs both input_shape and num_classes (or classes), got only "
                         f"{'input_shape' if shape is not None else 'num_classes'}")
    try:
        return Task(tuple(shape), count)
    except ValueError as exc:
        raise ValueError(f"[task] {exc}") from None


def run_coordinator(config: CoordinatorConfig,
                    on_round: Callable[[RoundRecord], None] | None = None,
                    on_progress: Callable[[FleetProgress], None] | None = None) -> RunReport | None:
    """Serve rounds to whatever devices register, then write the report.

    Returns None, touching nothing, when the checkpoint says the job already finished. A
    new job keeps an earlier job's report in ``out`` under a dated name. Ctrl-C writes the
    report of the rounds finished so far (the checkpoint resumes the rest) and propagates.
    """
    resolve_device(config.federation.eval_device)  # no such GPU: one line now, before anything is touched
    checkpoint_dir = config.federation.checkpoint_dir
    checkpoint = load_checkpoint(Path(checkpoint_dir)) if checkpoint_dir else None
    signer = _signer(config)  # a missing key is an error even for a finished job: the config is wrong
    task, preprocessing, eval_data = job_task(config)
    if config.model == AUTO:  # the family the task's shape calls for
        config = replace(config, model=default_family(task.input_shape, config.method))
    config, recipe = with_family_training(config)
    identity = job_identity(config.method, config.options, config.model, task.input_shape, task.num_classes,
                            config.federation.seed)
    if checkpoint is not None:
        refuse_another_job(checkpoint.job, identity, f"the checkpoint in {checkpoint_dir}")
    if checkpoint is not None and checkpoint.round + 1 >= config.federation.rounds:
        log.info("job %r finished its %d rounds already (checkpoint in %s)", config.job, checkpoint.round + 1,
                 checkpoint_dir)
        return None
    writable_dir(config.out, "the report folder (out)")
    if checkpoint_dir:
        writable_dir(checkpoint_dir, "[federation] checkpoint_dir")
    public, public_set = None, None
    if strategy_class(config.method).needs_public_data:
        if config.public_dataset is None:
            raise ValueError(f"method {config.method!r} needs public_dataset = \"...\" in the config")
        public_set = load_dataset(config.public_dataset, root=config.data_root)
    if public_set is not None:
        public = preprocessing.convert_from(public_set.preprocessing, public_set.x_train)
    strategy = create_strategy(config.method, StrategyContext(
        federation=config.federation, model_family=config.model, input_shape=task.input_shape,
        num_classes=task.num_classes, public_data=public, options=dict(config.options),
    ))
    out = Path(config.out)
    report = RunReport(method=config.method, config={"job": config.job, "method": config.method,
                                                     "model": config.model, "dataset": config.dataset,
                                                     "rounds": config.federation.rounds,
                                                     "family_recipe": recipe})
    connection = JobConnection(config.transport, config.job, config.link, config.limits, signer, task,
                               homeassistant=config.homeassistant, removed_devices=config.removed_devices)
    return run_job(strategy, report, connection, out, eval_data=eval_data, preprocessing=preprocessing,
                   on_round=on_round, on_progress=on_progress, identity=identity,
                   keep_previous=checkpoint is None, write_every_round=True,
                   fleet_normalisation=config.fleet_normalisation)


def job_task(config: CoordinatorConfig) -> tuple[Task, Preprocessing, EvalData | None]:
    """What the job learns, its normalisation and the held-out data (None: the coordinator has
    none): from ``dataset`` (checked against `[task]`), or from `[task]` alone."""
    if config.dataset is None:
        if config.task_shape is None or config.task is None:
            raise ValueError("without a dataset (held-out data) the task comes from [task] alone: it needs "
                             "input_shape, num_classes (or classes), mean and std")
        task = config.task_shape
        log.info("no held-out data: the task is [task]'s, inputs of shape %s in %d classes", task.input_shape,
                 task.num_classes)
        return task, replace(config.task, input_shape=task.input_shape), None
    dataset = load_dataset(config.dataset, root=config.data_root, seed=config.federation.seed)
    task = Task(tuple(dataset.input_shape), dataset.num_classes)
    if config.task_shape is not None and config.task_shape != task:
        raise ValueError(f"[task] says inputs of shape {config.task_shape.input_shape} in "
                         f"{config.task_shape.num_classes} classes; dataset {config.dataset!r} has "
                         f"{task.input_shape} in {task.num_classes}")
    preprocessing, eval_x = job_preprocessing(dataset, config.task)
    return task, preprocessing, EvalData(eval_x, dataset.y_test)


def job_preprocessing(dataset: ImageDataset, task: Preprocessing | None) -> tuple[Preprocessing, np.ndarray]:
    """The job's preprocessing (``task``'s normalisation, else the dataset's training statistics;
    ``task``'s class names, else the dataset's) and the held-out inputs in that normalisation."""
    own = dataset.preprocessing
    if task is None:
        return own, dataset.x_test
    if task.classes and len(task.classes) != dataset.num_classes:
        raise ValueError(f"[task] classes names {len(task.classes)} classes; the data has {dataset.num_classes}")
    job = Preprocessing(task.mean, task.std, task.classes or own.classes, dataset.input_shape,
                        (task.resample or own.resample) and not (task.repeat or own.repeat),
                        (task.repeat or own.repeat) and not task.resample)
    log.info("the job normalises inputs with [task] mean %s, std %s", list(job.mean), list(job.std))
    return job, job.convert_from(own, dataset.x_test)


def _signer(config: CoordinatorConfig) -> ModelSigner | None:
    """The key that signs published models, loaded before anything else (ValueError: one line)."""
    if config.signing_key is None:
        if config.federation.publish:
            log.warning("published models go out unsigned: devices that trust a coordinator key refuse them; "
                        "set [security] signing_key (docs/deploy.md, \"Signed models\")")
        return None
    signer = ModelSigner.from_pem_file(config.signing_key)
    if Path(config.signing_key).stat().st_mode & 0o004:
        log.warning("signing key %s is readable by every user of this machine: chmod 0600 (or 0640 with the "
                    "coordinator's group)", config.signing_key)
    log.info("published models are signed with key %s (%s)", signer.key_id, config.signing_key)
    return signer
