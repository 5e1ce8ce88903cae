"""A federated method on the coordinator: its descriptor and its hooks.

The round loop (:class:`coordinator.runtime.round_loop.RoundLoop`) owns the fleet, the report,
checkpoints, publishing, the held-out data and failure accounting, and calls these hooks with
explicit arguments; a method holds only its settings and its model state (docs/architecture.md,
docs/methods/adding-a-method.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from edge_sdk.accelerator import resolve_device
from edge_sdk.protocol.messages import Evaluation, Plan, Update
from edge_sdk.training import TrainConfig, evaluate

from edge_sdk.methods.registry import find_method
from edge_sdk.methods.settings.options import parse, to_wire
from edge_sdk.methods.settings.shared import RobustConfig, ServerOptConfig

from coordinator.aggregate.evaluation import FederatedEvaluation, fold_evaluations
from coordinator.aggregate.robust import robust_aggregate
from coordinator.aggregate.server_opt import ServerOptimizer
from coordinator.strategies.proximal import with_prox_mu
from coordinator.core.federation import EvalData, FederationConfig
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.lr_schedule import lr_factor

__all__ = ["Strategy", "StrategyContext", "OnnxExport", "OnnxNetwork", "seeded_init"]


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """A block in which torch's default generator starts from ``seed``, restored afterwards: a
    method builds its initial model in it without reseeding anyone else's random numbers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@dataclass(frozen=True)
class StrategyContext:
    """What any method may build itself from: the CLI, simulation and server all pass this."""

    federation: FederationConfig
    model_family: str
    input_shape: tuple[int, ...]
    num_classes: int
    _: KW_ONLY  # the rest by name: a positional EvalData once slipped into public_data
    #: Unlabeled inputs that no device holds (only for methods with `needs_public_data`).
    public_data: np.ndarray | None = None
    #: Method-specific settings as strings (`--option key=value`), parsed by the method.
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OnnxNetwork:
    """One network a method has the round loop export to ONNX after the run (`Strategy.onnx_export`)."""

    label: str
    file_name: str  # in the export folder, e.g. ``flanc-w0.5.onnx``
    #: what is written: the network as plain dense layers, in eval mode
    dense: torch.nn.Module
    #: the network as trained, in eval mode: the export reports how far ``dense`` computes from it
    trained: torch.nn.Module


@dataclass(frozen=True)
class OnnxExport:
    """What a method has the round loop export to ONNX after the run: the folder and the networks,
    which the loop takes one at a time (``networks`` may build each as it is asked for) and checks
    on up to 64 held-out samples (`coordinator.runtime.export.export_networks`)."""

    out_dir: str
    networks: Iterable[OnnxNetwork]


class Strategy(ABC):
    """A federated method on the coordinator. Subclasses implement the hooks; the round loop calls them.

    A subclass names its method (``name``); everything else the registry
    (:mod:`edge_sdk.methods.registry`) says of it is read from there when the class is defined:
    its settings dataclass (``settings_type``) and the device part that trains its plans
    (``device_method``, which a device must list in its capabilities). The registry's entry for
    the method names this class, and :data:`coordinator.strategies.STRATEGIES` finds it from there.
    """

    name: ClassVar[str] = ""
    #: True when the method distils on a public unlabeled set (the simulation then holds one out).
    needs_public_data: ClassVar[bool] = False
    #: what the method compresses in a model of your own (``--model spec:FILE``): one line that says
    #: so, or "" when it builds its networks from a model family only and refuses spec files
    spec_file_support: ClassVar[str] = ""
    #: The device part its plans name (``edge_sdk.methods.DEVICE_METHODS``), from the registry.
    device_method: ClassVar[str] = ""
    #: Its settings, from the registry: one frozen dataclass whose fields are the ``--option``
    #: keys, with their one default and help (``edgefl simulate --method M --option help``).
    settings_type: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:  # an abstract base in between names none
            method = find_method(cls.name)
            cls.settings_type = method.settings
            cls.device_method = method.device_part

    @classmethod
    def device_part(cls) -> str:
        """The name of the device part that trains this method's plans."""
        return cls.device_method

    @classmethod
    def parse_options(cls, options: Mapping[str, str]) -> Any:
        """The method's typed settings from ``--option`` text; unknown keys and bad values raise a
        one-line ValueError naming the method."""
        return parse(cls.settings_type, cls.name, options)

    @classmethod
    def own_lr(cls, options: Mapping[str, str]) -> str | None:
        """With these ``--option`` settings, the learning rate the method's devices train with
        instead of the run's ``--lr``/``[train] lr`` (said to the user), or None when they use it
        (the settings' ``own_lr()``, where they have one)."""
        own = getattr(cls.parse_options(options), "own_lr", None)
        return None if own is None else own()

    @classmethod
    @abstractmethod
    def create(cls, ctx: StrategyContext) -> "Strategy":
        """Build the method from a context (model family, shapes, options)."""

    @classmethod
    def method_federation(cls, ctx: StrategyContext, settings: Any) -> FederationConfig:
        """The job's federation settings as the method's ``settings`` change them: ``prox_mu``
        (every method's) goes into the training settings that every plan carries."""
        return with_prox_mu(ctx.federation, settings.prox)

    #: the method's typed settings (an instance of ``settings_type``), set by the subclass
    settings: Any

    def __init__(self, config: FederationConfig) -> None:
        self.config = config
        self.server_opt = ServerOptimizer()  # the moments of --option server_opt (none: unused)
        #: per aggregation group, the reference norm of its latest round with 3+ devices (robust.py)
        self._trusted_norms: dict[str, float] = {}

    # -- registration -------------------------------------------------------
    @abstractmethod
    def assign(self, device: DeviceRecord) -> str:
        """The label (width, level, ...) this device trains; called at registration."""

    def reassign(self, device: DeviceRecord) -> str:
        """The label of a registered device after a new measurement (default: :meth:`assign`)."""
        return self.assign(device)

    def relabelled(self) -> dict[str, str]:
        """Other devices whose label the last :meth:`assign` or :meth:`reassign` changed (device ->
        label), once: the round loop writes them into the fleet's records (default: none)."""
        return {}

    def setup(self, devices: Mapping[str, DeviceRecord], online: Sequence[str]) -> Mapping[str, str] | None:
        """Called once before the first round this run trains (a resumed job too), when the
        fleet has registered: decisions that need the fleet (e.g. a pruning level for the weakest
        device, FedPara's γ for the fleet's links). Returns the new labels of registered devices
        (device -> label), which the round loop writes into the fleet's records; None: none change."""
        return None  # an optional hook: nothing to do by default

    # -- a round ------------------------------------------------------------
    def round_stages(self, rnd: int, online: Sequence[DeviceRecord]) -> list[Any]:
        """The sequential collections of round ``rnd`` (default: one, ``None``).

        Each stage is announced, collected, aggregated and evaluated like a whole round
        (e.g. FDNNC's SWITCH: big devices first, then small ones); the report keeps one
        record per round that sums the stages' bytes and seconds (`merge_stages`).
        """
        return [None]

    def begin_stage(self, rnd: int, stage: Any) -> None:
        """Called before each stage of round ``rnd`` (e.g. to choose who trains in it)."""
        return None  # an optional hook: nothing to do by default

    def candidates(self, online: list[str]) -> list[str]:
        """The online devices this stage may sample from (default: all of them)."""
        return online

    def begin_round_plans(self, rnd: int, participants: list[str]) -> None:
        """Called once the participants of a stage of round ``rnd`` are known, before the round
        is announced and their plans go out: e.g. to draw their widths together, prune their
        models, or choose what each uploads."""
        return None  # an optional hook: nothing to do by default

    @abstractmethod
    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        """The plan to send to `device` in round `rnd`; its ``train`` is :meth:`plan_train`'s."""

    def own_train(self, train: TrainConfig) -> TrainConfig:
        """The training settings this method's devices use, from the job's ``train`` before the lr
        schedule: a method with its own optimizer, lr or epochs replaces them (default: the job's)."""
        return train

    def plan_train(self, rnd: int, *round_settings: Any) -> dict[str, Any]:
        """A plan's ``train`` in round ``rnd``, built here for every method: :meth:`own_train` under
        the job's lr schedule (applied here, once), every device setting of the method's settings
        (``to_wire(self.settings)``: each travels in every plan), then ``round_settings``, the
        round's own settings dataclasses (e.g. what FDNNC asks a device to upload)."""
        train = self.own_train(self.config.train)
        factor = lr_factor(self.config.lr_decay, rnd)
        if factor != 1.0:
            train = replace(train, lr=train.lr * factor)
        wire = {**train.to_dict(), **to_wire(self.settings)}
        for settings in round_settings:
            wire.update(to_wire(settings))
        return wire

    @abstractmethod
    def check_update(self, device: DeviceRecord, update: Update) -> None:
        """Raise `UpdateRejected` unless `update` fits what `device` was sent."""

    @abstractmethod
    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        """Fold the round's valid updates into the global state; returns metrics. ``failures``:
        the devices asked that reported a failed training, with their messages."""

    def configure_evaluate(self, rnd: int, device: DeviceRecord) -> Plan | None:
        """Federated evaluation: the model ``device`` evaluates on its own held-out data after
        round ``rnd`` — the one it would be served — as a plan carries it (None: it evaluates
        nothing). The default is its training plan with the job's settings: a method whose
        :meth:`configure_train` records what it sent (to check the update) overrides this."""
        return self.configure_train(rnd, device)

    def aggregate_evaluate(self, rnd: int, reports: Mapping[str, Evaluation],
                           missing: Sequence[str] = ()) -> FederatedEvaluation:
        """Federated evaluation: the devices' reports (by device; ``missing``: asked, no answer in
        time) folded sample-weighted per model label (:func:`fold_evaluations`)."""
        return fold_evaluations(reports, missing)

    @abstractmethod
    def evaluate(self, rnd: int, data: EvalData) -> tuple[dict[str, float], float]:
        """Accuracy per label and a loss, on the coordinator's held-out ``data``."""

    def reported_accuracy(self, rnd: int) -> dict[str, float]:
        """Accuracy per label that the devices reported with round ``rnd``'s updates (e.g.
        pFedPara's ``local``), shown beside :meth:`evaluate`'s in evaluated rounds (default: none)."""
        return {}

    def finished(self, data: EvalData | None) -> None:
        """Called once after the last round, with the held-out data (None: none)."""
        return None  # an optional hook: nothing to do by default

    def onnx_export(self) -> OnnxExport | None:
        """What the round loop exports to ONNX after the last round (e.g. every width's dense network,
        with ``--option export=DIR``); None: nothing (the default)."""
        return None

    # -- models and state ---------------------------------------------------
    @abstractmethod
    def model_params(self) -> dict[str, int]:
        """Parameter count of the model a device of each label trains."""

    @abstractmethod
    def state_tensors(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as named tensors."""

    @abstractmethod
    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        """Restore what `state_tensors` returned."""

    def state_spec(self) -> dict[str, Any] | None:
        """The spec of the one network whose tensors `state_tensors` holds under their own names
        (e.g. a MiniRocket layer's biases, which the round loop fits); None: no such network."""
        return None

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

    # -- helpers for the hooks ----------------------------------------------
    def evaluate_model(self, model: Any, data: EvalData) -> tuple[float, float]:
        """``(accuracy, loss)`` of a torch ``model`` on ``data``, on `eval_device`."""
        return evaluate(model, data.x, data.y, device=resolve_device(self.config.eval_device))

    def fold(self, group: str, current: Mapping[str, np.ndarray], tensor_sets: Sequence[Mapping[str, np.ndarray]],
             weights: Sequence[float], rule: RobustConfig,
             server: ServerOptConfig | None = None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The new tensors of ``group`` from the devices' ``tensor_sets``: the robust rule's result,
        stepped by the server optimizer when ``server`` names one; and the rule's metrics.

        The norm screen of a round with three or more devices in ``group`` sets the group's trusted
        reference norm, which bounds the rounds in which only one or two report
        (:func:`coordinator.aggregate.robust.reference_norm`)."""
        aggregate, metrics = robust_aggregate(current, tensor_sets, weights, rule,
                                              trusted_norm=self._trusted_norms.get(group))
        if len(tensor_sets) >= 3 and "norm_reference" in metrics:
            self._trusted_norms[group] = metrics["norm_reference"]
        if server is None or not server.active:
            return aggregate, metrics
        return self.server_opt.step(server, group, current, aggregate), metrics
