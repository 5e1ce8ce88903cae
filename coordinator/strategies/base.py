"""The Strategy base class: it owns the round loop, methods fill in the hooks.

A round: sample online devices → announce the round → send each its plan →
collect valid updates until all arrived or the deadline → aggregate when a
quorum arrived → evaluate → checkpoint.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.preprocessing import Preprocessing
from edge_sdk.protocol.messages import Plan, RoundStart, Stop, Update
from edge_sdk.training import TrainConfig, evaluate

from coordinator.runtime.fleet import DeviceRecord, Fleet, ReceivedUpdate
from coordinator.options import Schema
from coordinator.runtime.lr_schedule import LrDecay, check_lr_decay, lr_factor, parse_lr_decay
from coordinator.runtime.report import RoundRecord, RunReport, merge_stages
from coordinator.aggregate.robust import RobustConfig, robust_aggregate
from coordinator.aggregate.server_opt import ServerOptimizer
from coordinator.runtime.state import load_checkpoint, save_checkpoint

__all__ = ["FederationConfig", "Strategy", "StrategyContext", "EvalData", "TrainingFailed"]

log = logging.getLogger(__name__)
_SERVER_OPT = "server_opt:"  # checkpoint tensors of the server optimizer's moments


@dataclass(frozen=True)
class FederationConfig:
    """Round-loop settings shared by every method."""

    rounds: int = 5
    min_devices: int = 2
    devices_per_round: int | None = None  # None: every online device
    quorum: float = 0.5  # fraction of participants needed to aggregate
    round_deadline_s: float = 600.0
    register_timeout_s: float = 120.0
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint_dir: str | None = None
    publish: bool = True  # after the last round, send every device the ONNX model of its label
    #: ...as a retained message, so a device that is offline then installs it when it reconnects
    retain_models: bool = True
    #: also publish after every this many rounds (0: only after the last), for long jobs
    publish_every: int = 0
    #: evaluate on the held-out data after every this many rounds; the last round always does
    eval_every: int = 1
    #: ((round, factor), ...): after `round` rounds every plan's lr is multiplied by `factor`
    lr_decay: LrDecay = ()
    #: interim evaluations use a fixed stratified subset of this many held-out samples (None:
    #: all of them); the last round always evaluates on the whole held-out set
    eval_samples: int | None = None
    #: where the coordinator evaluates: cpu, cuda, cuda:N or auto (a GPU when torch sees one)
    eval_device: str = "cpu"
    #: stop the job (`TrainingFailed`) when every device asked reports a failed local training
    #: this many rounds in a row (0: never; a simulation uses 3: its devices fail alike every round)
    stop_after_failed_rounds: int = 0

    def __post_init__(self) -> None:
        decay = self.lr_decay
        object.__setattr__(self, "lr_decay", parse_lr_decay(decay) if isinstance(decay, str) else check_lr_decay(decay))
        for name, low in (("rounds", 1), ("min_devices", 1), ("publish_every", 0), ("eval_every", 1),
                          ("stop_after_failed_rounds", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        resolve_device(self.eval_device)
        if self.eval_samples is not None and (type(self.eval_samples) is not int or self.eval_samples < 1):
            raise ValueError(f"eval_samples must be an integer >= 1 (or absent: all), got {self.eval_samples!r}")
        k = self.devices_per_round
        if k is not None and (type(k) is not int or k < 1):
            raise ValueError(f"devices_per_round must be an integer >= 1 (or absent: every device), got {k!r}")
        if not (isinstance(self.quorum, (int, float)) and 0 < self.quorum <= 1):
            raise ValueError(f"quorum must be a fraction in (0, 1], got {self.quorum!r}")
        for name in ("round_deadline_s", "register_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if type(self.seed) is not int:
            raise ValueError(f"seed must be an integer, got {self.seed!r}")


class TrainingFailed(RuntimeError):
    """Every device asked failed its local training in `FederationConfig.stop_after_failed_rounds`
    rounds in a row (e.g. a model that cannot train where the devices train): the job stops."""


@dataclass(frozen=True)
class EvalData:
    """Held-out real data the coordinator evaluates on."""

    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class StrategyContext:
    """What any method may build itself from: the CLI, simulation and server all pass this."""

    federation: FederationConfig
    model_family: str
    input_shape: tuple[int, ...]
    num_classes: int
    eval_data: EvalData | None = None
    #: Unlabeled inputs that no device holds (only for methods with `needs_public_data`).
    public_data: np.ndarray | None = None
    #: Method-specific settings as strings (`--option key=value`), parsed by the method.
    options: dict[str, str] = field(default_factory=dict)
    #: The job's input normalisation and class names: sent in every plan, published with the model
    #: (edge_sdk/preprocessing.py); None: devices keep their own and published models carry none.
    preprocessing: Preprocessing | None = None


class Strategy(ABC):
    """A federated method on the coordinator. Subclasses implement the hooks.

    The class is the method's descriptor: its ``name``, the device part that trains its plans
    (``device_method``, which a device must list in its capabilities), its ``option_schema`` and
    :meth:`parse_options`, and :meth:`create`; :data:`coordinator.strategies.STRATEGIES` registers it.
    """

    name: ClassVar[str] = ""
    #: True when the method distils on a public unlabeled set (the simulation then holds one out).
    needs_public_data: ClassVar[bool] = False
    #: The device part its plans name (``edge_sdk.methods.DEVICE_METHODS``); empty: ``name``.
    device_method: ClassVar[str] = ""
    #: Its ``--option`` keys (``edgefl simulate --method M --option help`` prints them).
    option_schema: ClassVar[Schema] = Schema()
    #: The page that documents them, under docs/methods/.
    doc_page: ClassVar[str] = ""

    @classmethod
    def device_part(cls) -> str:
        """The name of the device part that trains this method's plans."""
        return cls.device_method or cls.name

    @classmethod
    def parse_options(cls, options: Mapping[str, str]) -> Any:
        """The method's typed settings from ``--option`` text; unknown keys and bad values raise a
        one-line ValueError naming the method."""
        return cls.option_schema.parse(cls.name, options)

    @classmethod
    def own_lr(cls, options: Mapping[str, str]) -> str | None:
        """With these ``--option`` settings, the learning rate the method's devices train with
        instead of the run's ``--lr``/``[train] lr`` (said to the user), or None when they use it."""
        return None

    @classmethod
    def options_help(cls) -> str:
        """The table of options, defaults and help that ``--option help`` prints."""
        return cls.option_schema.help_text(cls.name, f"docs/methods/{cls.doc_page or cls.name}.md")

    @classmethod
    @abstractmethod
    def create(cls, ctx: StrategyContext) -> "Strategy":
        """Build the method from a context (model family, shapes, options)."""

    def __init__(self, config: FederationConfig, eval_data: EvalData | None = None) -> None:
        self.config = config
        self.eval_data = eval_data
        self._full_eval = eval_data
        self._eval_subset: EvalData | None = None  # the interim evaluations' subset (eval_samples)
        self.rng = np.random.default_rng(config.seed)
        self.payload_bytes: dict[str, int] = {}
        self.published: list = []  # what publish_models sent the last time
        self.server_opt = ServerOptimizer()  # the moments of --option server_opt (none: unused)
        self._failed_in_a_row = 0  # rounds (stages) in a row in which every device asked failed
        #: per aggregation group, the reference norm of its latest round with 3+ devices (robust.py)
        self._trusted_norms: dict[str, float] = {}
        self._last_failure = ""
        #: the job's input normalisation (StrategyContext.preprocessing; set by `create_strategy`)
        self.preprocessing: Preprocessing | None = None

    # -- hooks --------------------------------------------------------------
    @abstractmethod
    def assign(self, device: DeviceRecord) -> str:
        """The label (width, level, ...) this device trains; called at registration."""

    @abstractmethod
    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        """The plan to send to `device` in round `rnd`."""

    @abstractmethod
    def check_update(self, device: DeviceRecord, update: Update) -> None:
        """Raise `UpdateRejected` unless `update` fits what `device` was sent."""

    @abstractmethod
    def aggregate_train(self, rnd: int, updates: list[ReceivedUpdate]) -> dict[str, float]:
        """Fold the round's valid updates into the global state; returns metrics."""

    @abstractmethod
    def evaluate(self, rnd: int) -> tuple[dict[str, float], float]:
        """Accuracy per label and a loss, on the held-out data."""

    @abstractmethod
    def model_params(self) -> dict[str, int]:
        """Parameter count of the model a device of each label trains."""

    @abstractmethod
    def state_tensors(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as named tensors."""

    @abstractmethod
    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        """Restore what `state_tensors` returned."""

    @classmethod
    def describe_label(cls, label: str) -> str:
        """How a person reads ``label`` in output and plots (e.g. ``width 0.25``); the report
        keeps the label itself."""
        return label

    def method_config(self) -> dict[str, Any]:
        """Method-specific settings for the report."""
        return {}

    def inference_model(self, label: str) -> Any:
        """The dense torch network devices of ``label`` run after training (an ``nn.Module``
        with ``input_shape``), or None when the method has nothing to publish to them."""
        return None

    # -- the loop -----------------------------------------------------------
    def on_register(self, device: DeviceRecord) -> None:
        """Fleet callback: assign a label to a newly registered device."""
        device.label = self.assign(device)

    def on_profile_update(self, device: DeviceRecord) -> None:
        """Fleet callback, between rounds: a registered device measured itself again and its
        profile's GFLOPS changed; its label for the rounds to come (:meth:`reassign`)."""
        device.label = self.reassign(device)

    def reassign(self, device: DeviceRecord) -> str:
        """The label of a registered device after a new measurement (default: :meth:`assign`)."""
        return self.assign(device)

    def sample(self, online: list[str]) -> list[str]:
        """The devices of this round."""
        k = self.config.devices_per_round
        if k is None or k >= len(online):
            return list(online)
        return sorted(self.rng.choice(online, size=k, replace=False).tolist())

    def run(self, fleet: Fleet, report: RunReport,
            on_round: Callable[[RoundRecord], None] | None = None) -> RunReport:
        """Run every remaining round; returns the filled report."""
        fleet.on_register = self.on_register
        fleet.on_profile_update = self.on_profile_update
        for device in fleet.devices.values():
            self.on_register(device)
        start = self._resume(report)
        if start < self.config.rounds:
            online = fleet.wait_for_devices(self.config.min_devices, self.config.register_timeout_s)
            if len(online) < self.config.min_devices:
                raise TimeoutError(f"only {len(online)} of {self.config.min_devices} devices registered "
                                   f"within {self.config.register_timeout_s} s")
            self.setup(fleet)
        every = self.config.publish_every
        try:
            for rnd in range(start, self.config.rounds):
                record = self._round(fleet, rnd)
                report.add_round(record)
                self._checkpoint(rnd, report)
                if on_round is not None:
                    on_round(record)
                self._stop_if_training_fails(rnd)
                if every > 0 and (rnd + 1) % every == 0 and rnd + 1 < self.config.rounds:
                    self._publish(fleet, rnd)  # an interim model
        except BaseException:  # Ctrl-C or an error: the report of the finished rounds names the devices
            report.finish(fleet, self.model_params(), self.payload_bytes)
            raise
        self._publish(fleet, self.config.rounds - 1)
        fleet.broadcast(Stop("training finished"))
        report.finish(fleet, self.model_params(), self.payload_bytes)
        return report

    def _stop_if_training_fails(self, rnd: int) -> None:
        limit = self.config.stop_after_failed_rounds
        if limit and self._failed_in_a_row >= limit:
            raise TrainingFailed(f"every device failed its training in the last {self._failed_in_a_row} rounds "
                                 f"(to round {rnd + 1}): {self._last_failure}")

    def _publish(self, fleet: Fleet, rnd: int) -> None:
        """Send every device the model of its label as of round ``rnd`` (when publishing is on)."""
        if self.config.publish:
            from coordinator.runtime.publish import publish_models
            self.published = publish_models(self, fleet, rnd, retain=self.config.retain_models)

    def setup(self, fleet: Fleet) -> None:
        """Called once before the first round this run trains (a resumed job too), when the
        fleet has registered: decisions that need the fleet (e.g. a pruning level for the weakest
        device, FedPara's γ for the fleet's links)."""

    def round_stages(self, fleet: Fleet, rnd: int) -> list[Any]:
        """The sequential collections of round ``rnd`` (default: one, ``None``).

        Each stage is announced, collected, aggregated and evaluated like a whole round
        (e.g. FDNNC's SWITCH: big devices first, then small ones); the report keeps one
        record per round that sums the stages' bytes and seconds (:func:`merge_stages`).
        """
        return [None]

    def begin_stage(self, rnd: int, stage: Any) -> None:
        """Called before each stage of round ``rnd`` (e.g. to choose who trains in it)."""

    def evaluate_model(self, model: Any) -> tuple[float, float]:
        """``(accuracy, loss)`` of a torch ``model`` on the held-out data, on `eval_device`."""
        assert self.eval_data is not None
        return evaluate(model, self.eval_data.x, self.eval_data.y, device=resolve_device(self.config.eval_device))

    def begin_round_plans(self, rnd: int, participants: list[str]) -> None:
        """Called once the participants of a stage of round ``rnd`` are known (``sample`` only
        samples), before the round is announced and their plans go out: e.g. to draw their widths
        together, prune their models, or choose what each uploads."""

    def evaluates(self, rnd: int) -> bool:
        """Whether round ``rnd`` (0-based) is evaluated: every `eval_every`-th and the last."""
        return (rnd + 1) % self.config.eval_every == 0 or rnd + 1 == self.config.rounds

    def _round(self, fleet: Fleet, rnd: int) -> RoundRecord:
        if not fleet.online():  # the whole fleet dropped (e.g. with the broker): wait for it as for round 0
            fleet.wait_for_devices(self.config.min_devices, self.config.register_timeout_s)
        self.rng = np.random.default_rng([self.config.seed, rnd])  # a resumed job samples alike
        records = []
        for stage in self.round_stages(fleet, rnd):
            self.begin_stage(rnd, stage)
            records.append(self._stage(fleet, rnd))
        return merge_stages(records)

    def _stage(self, fleet: Fleet, rnd: int) -> RoundRecord:
        online = fleet.online()
        started = time.monotonic()
        participants = self.sample(online)
        self.begin_round_plans(rnd, participants)
        down = fleet.broadcast(RoundStart(self.config.round_deadline_s, tuple(participants)), rnd)
        sent: dict[str, int] = {}
        factor = lr_factor(self.config.lr_decay, rnd)
        for device_id in participants:
            record = fleet.devices[device_id]
            plan = self.configure_train(rnd, record)
            if factor != 1.0 and "lr" in plan.train:
                plan = replace(plan, train={**plan.train, "lr": plan.train["lr"] * factor})
            if self.preprocessing is not None:
                plan = replace(plan, preprocessing=self.preprocessing.normalisation())
            sent[device_id] = fleet.send(device_id, plan, rnd)
            self.payload_bytes.setdefault(plan.label, sent[device_id])
        updates = fleet.collect(rnd, participants, self.config.round_deadline_s,
                                lambda record, update: self.check_update(record, update))
        failed = fleet.round_failures
        if participants and set(failed) >= set(participants):
            self._failed_in_a_row += 1
            self._last_failure = next(iter(failed.values()))
        else:
            self._failed_in_a_row = 0
        needed = max(1, int(np.ceil(self.config.quorum * len(participants))))
        metrics: dict[str, float] = {}
        if len(updates) >= needed:
            metrics = self.aggregate_train(rnd, list(updates.values()))
        else:
            log.warning("round %d: %d of %d updates, below quorum %d; model unchanged",
                        rnd + 1, len(updates), len(participants), needed)
        accuracy: dict[str, float] = {}
        loss: float | None = None
        if self.evaluates(rnd):
            held_out = self._eval_set(last=rnd + 1 == self.config.rounds)
            accuracy, loss = self._evaluate_on(held_out, rnd)
            if held_out is not None:
                metrics = {**metrics, "eval_samples": float(len(held_out.y))}
        up = sum(u.nbytes for u in updates.values())
        return RoundRecord(
            round=rnd, accuracy=accuracy, loss=loss,
            bytes_down=down + sum(sent.values()), bytes_up=up,
            seconds=self._simulated_seconds(fleet, sent, updates),
            host_seconds=time.monotonic() - started,
            participants=sorted(updates), aggregated=len(updates) >= needed,
            metrics=metrics,
        )

    def _eval_set(self, last: bool) -> EvalData | None:
        """The held-out data of an evaluation: all of it in the last round or without
        ``eval_samples``, else a fixed stratified subset of ``eval_samples`` (seeded)."""
        full, n = self._full_eval, self.config.eval_samples
        if full is None or last or n is None or n >= len(full.y):
            return full
        if self._eval_subset is None:
            self._eval_subset = _stratified(full, n, self.config.seed)
        return self._eval_subset

    def _evaluate_on(self, data: EvalData | None, rnd: int) -> tuple[dict[str, float], float]:
        """:meth:`evaluate` on ``data`` (the hooks read ``self.eval_data``)."""
        self.eval_data = data
        try:
            return self.evaluate(rnd)
        finally:
            self.eval_data = self._full_eval

    def _simulated_seconds(self, fleet: Fleet, sent: dict[str, int],
                           updates: dict[str, ReceivedUpdate]) -> float:
        """Round wall-clock on the profiled devices: the slowest download+compute+upload."""
        slowest = 0.0
        for device_id, received in updates.items():
            profile = fleet.devices[device_id].profile
            down_s = sent[device_id] * 8 / (profile.downlink_mbps * 1e6)
            up_s = received.nbytes * 8 / (profile.uplink_mbps * 1e6)
            compute_s = float(received.update.metrics.get("compute_s", 0.0))
            slowest = max(slowest, down_s + compute_s + up_s)
        if len(updates) < len(sent):
            slowest = max(slowest, self.config.round_deadline_s)
        return slowest

    # -- aggregation --------------------------------------------------------
    def fold(self, group: str, current: Mapping[str, np.ndarray], tensor_sets: Sequence[Mapping[str, np.ndarray]],
             weights: Sequence[float], rule: RobustConfig) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The new tensors of ``group`` from the devices' ``tensor_sets``: the robust rule's result,
        stepped by the server optimizer when ``rule.server`` names one; and the rule's metrics.

        The norm screen of a round with three or more devices in ``group`` sets the group's trusted
        reference norm, which bounds the rounds in which only one or two report
        (:func:`coordinator.aggregate.robust.reference_norm`)."""
        aggregate, metrics = robust_aggregate(current, tensor_sets, weights, rule,
                                              trusted_norm=self._trusted_norms.get(group))
        if len(tensor_sets) >= 3 and "norm_reference" in metrics:
            self._trusted_norms[group] = metrics["norm_reference"]
        return self.server_opt.step(rule.server, group, current, aggregate), metrics

    # -- checkpoints --------------------------------------------------------
    def _checkpoint(self, rnd: int, report: RunReport) -> None:
        if self.config.checkpoint_dir is None:
            return
        tensors = {**self.state_tensors(),
                   **{_SERVER_OPT + k: v for k, v in self.server_opt.state_tensors().items()}}
        save_checkpoint(Path(self.config.checkpoint_dir), self.name, rnd, report.rounds_as_dicts(), tensors)

    def _resume(self, report: RunReport) -> int:
        if self.config.checkpoint_dir is None:
            return 0
        checkpoint = load_checkpoint(Path(self.config.checkpoint_dir))
        if checkpoint is None:
            return 0
        if checkpoint.method != self.name:
            raise ValueError(f"checkpoint is for {checkpoint.method!r}, not {self.name!r}")
        own = {k: v for k, v in checkpoint.tensors.items() if not k.startswith(_SERVER_OPT)}
        self.load_state_tensors(own)
        self.server_opt.load_state_tensors({k[len(_SERVER_OPT):]: v for k, v in checkpoint.tensors.items()
                                            if k.startswith(_SERVER_OPT)})
        report.restore_rounds(checkpoint.rounds)
        log.info("resumed after round %d", checkpoint.round + 1)
        return checkpoint.round + 1


def _stratified(data: EvalData, n: int, seed: int) -> EvalData:
    """``n`` samples of ``data``, each class in proportion (seeded, in their original order)."""
    rng = np.random.default_rng([seed, 0xE5A1])
    order = rng.permutation(len(data.y))
    key = np.empty(len(order))
    for c in np.unique(data.y):  # a sample's rank within its class, as a fraction
        members = order[data.y[order] == c]
        key[members] = (np.arange(len(members)) + 0.5) / len(members)
    pick = np.sort(order[np.argsort(key[order], kind="stable")[:n]])
    return EvalData(data.x[pick], data.y[pick])
