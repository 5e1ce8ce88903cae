"""FedPara (Hyeon-Woo, Ye-Bin, Oh; ICLR 2022): factors of low-rank Hadamard products travel.

Every conv/linear layer of the zoo network is a FedPara layer (:mod:`edge_sdk.models.fedpara`,
:mod:`edge_sdk.models.fedpara_zoo`) whose rank comes from ``γ``: a fixed ``gamma`` or,
by default, the largest ``γ`` whose plan + update fit the fleet's measured link
budget (:func:`choose_gamma`, chosen when the
first round starts). With several ``widths`` a device trains the width its FLOPS
afford (:mod:`coordinator.strategies.assignment`): it holds the first ``ceil(p·m)`` rows of every
``X`` and ``ceil(p·n)`` rows of every ``Y`` (cores and ranks are shared), so its
weights are exactly the top-left blocks of the full network's. Aggregation averages
every element over the devices that hold it, weighted by sample counts (elements
nobody held keep their value). Evaluation is per width on the held-out data;
``export=DIR`` writes every width pre-composed to a dense network as ONNX.
:class:`coordinator.strategies.pfedpara.PFedPara` and
:class:`coordinator.strategies.naive_lowrank.LowRank` reuse all of this.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import numpy as np
import torch

from edge_sdk.methods.settings.fedpara import LowRankSettings
from edge_sdk.methods.settings.options import as_report
from edge_sdk.models.fedpara import FEDPARA_TYPES, FedParaLinear, personal_names, precompose
from edge_sdk.models.folding import folded_shape
from edge_sdk.models.fedpara_zoo import fedpara_spec, layer_ranks
from edge_sdk.models.spec import build_model, count_flops, count_params
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.tensors import SKIPPED_SUFFIXES, load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig

from coordinator.strategies.assignment import LevelAssigner
from coordinator.aggregate.averaging import mean_train_loss
from coordinator.aggregate.composed_server import ComposedLayer, composed_step
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import pick
from coordinator.aggregate.width_slicing import leading_block
from coordinator.strategies.width_base import WidthStrategy
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext, seeded_init
from coordinator.aggregate.validation import expected_from

__all__ = ["FedPara", "GAMMA_KEY", "GAMMA_GRID", "choose_gamma"]

GLOBAL = "global"
#: Name of the checkpoint tensor holding the γ in use.
GAMMA_KEY = "fedpara/gamma"


def _nested(layer: dict) -> list[list[dict]]:
    return [v for v in layer.values() if isinstance(v, list) and all(isinstance(x, dict) for x in v)]


def _personal_params(layers: list[dict]) -> int:
    """Entries of the W2 factors (x2, y2, t2) of every personal FedPara layer."""
    total = 0
    for layer in layers:
        if layer["type"] in FEDPARA_TYPES and layer.get("personal", False):
            r, k = layer["rank"], layer.get("kernel")
            rows, cols, _ = folded_shape(layer["out"], layer["in"], layer.get("blocks", 1), layer.get("block", 0))
            total += r * (rows + cols) + (r * r * k * k if k else 0)
        total += sum(_personal_params(sub) for sub in _nested(layer))
    return total


def _buffers(layers: list[dict]) -> int:
    """Entries of the float buffers that travel every round: BatchNorm's running statistics (not a
    MiniRocket layer's biases, which travel once: `Plan.fixed`)."""
    total = 0
    for layer in layers:
        if layer["type"] in ("batchnorm1d", "batchnorm2d") and layer.get("track_running_stats", True):
            total += 2 * layer["channels"]
        total += sum(_buffers(sub) for sub in _nested(layer))
    return total


class FedPara(WidthStrategy):
    """One factorised global network; each width trains its leading block of the factors."""

    name = "fedpara"
    #: pFedPara: personal layers whose W2 never leaves the device.
    personal: ClassVar[bool] = False

    def __init__(self, config: FederationConfig, options: LowRankSettings, family: str,
                 input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__(config)
        self.settings = options
        self.server_space = getattr(options, "server_space", "factors")  # the naive baseline's: its factors
        if self.personal and self.server_space == "composed":
            raise ValueError(f"{self.name}: server_space=composed needs each layer's whole product on the server; "
                             "pFedPara's W2 stays on the devices")
        #: the linear layers whose server step acts on their product (`_build`)
        self.composed: list[ComposedLayer] = []
        self.family, self.input_shape, self.num_classes = family, tuple(input_shape), num_classes
        self.zoo_kw = options.width.zoo_kwargs()
        widths = options.width.widths
        self.widths = {GLOBAL: 1.0} if options.single else dict(zip(options.width.labels, widths, strict=True))
        self.labels = list(self.widths)
        self.export_dir = options.width.export
        try:
            costs = {label: 3 * count_flops(model_for_dataset(family, self.input_shape, num_classes,
                                                              width=p, **self.zoo_kw)) / 1e9
                     for label, p in self.widths.items()}
        except TypeError as exc:
            raise ValueError(f"{self.name}: model family {family!r} does not take these options: {exc}") from None
        self.assigner = None if options.single else LevelAssigner(
            options.width.assignment, self.labels, costs, config.train.epochs)
        self.devices: dict[str, DeviceRecord] = {}
        self.gamma: float | None = None
        self.budget: dict[str, float] = {}
        self._planned: dict[str, str] = {}
        if options.gamma is not None:
            self._build(options.gamma)

    @classmethod
    def create(cls, ctx: StrategyContext) -> "FedPara":
        options = cls.parse_options(dict(ctx.options))
        return cls(cls.method_federation(ctx, options), options, ctx.model_family, tuple(ctx.input_shape),
                   ctx.num_classes)

    # -- the networks -------------------------------------------------------
    def spec_for(self, gamma: float, width: float) -> dict:
        """The network a width-``width`` device trains at ``γ`` (subclasses change the layers)."""
        return fedpara_spec(self.family, self.input_shape, self.num_classes, gamma, width=width,
                            tanh=self.settings.tanh, personal=self.personal,
                            layer_gammas=dict(self.settings.layer_gammas), **self.zoo_kw)

    @staticmethod
    def _sent_names(model: torch.nn.Module) -> list[str]:
        own = set(personal_names(model))
        return [k for k in model.state_dict() if k not in own and not k.endswith(SKIPPED_SUFFIXES)]

    def sent_bytes(self, label: str, gamma: float) -> int:
        """float32 bytes of the tensors a round's plan of width ``label`` carries at ``γ`` (from the spec;
        a MiniRocket layer's biases travel in a device's first plan only)."""
        spec = self.spec_for(gamma, self.widths[label])
        return 4 * (count_params(spec) - _personal_params(spec["layers"]) + _buffers(spec["layers"]))

    def _build(self, gamma: float) -> None:
        self.specs = {label: self.spec_for(gamma, p) for label, p in self.widths.items()}
        self.global_spec = self.specs[self.labels[-1]] if self.widths[self.labels[-1]] == 1.0 \
            else self.spec_for(gamma, 1.0)
        with seeded_init(self.config.seed):
            full = build_model(self.global_spec)
            state = state_to_numpy(full, copy=True)
            self.weights = {k: state[k] for k in self._sent_names(full)}
            self.composed = [ComposedLayer(f"{name}.", module.use_tanh) for name, module in full.named_modules()
                             if isinstance(module, FedParaLinear) and not module.personal and (
                                 self.server_space == "composed" or (self.server_space == "auto" and module.block))]
            self.models = {label: build_model(spec) for label, spec in self.specs.items()}
        self.expected = {}
        for label, model in self.models.items():
            own = set(personal_names(model))
            with torch.no_grad():  # the server's view of a personal layer: W2 = 0, so W = W1
                for name, param in model.named_parameters():
                    if name in own:
                        param.zero_()
            shapes = self._shapes(label)
            if set(shapes) != set(self.weights) or any(
                    len(s) != self.weights[k].ndim or any(a > b for a, b in zip(s, self.weights[k].shape, strict=True))
                    for k, s in shapes.items()):
                raise ValueError(f"width {label} is not a leading block of the full network")
            self.expected[label] = expected_from(self.tensors(label))
        self.gamma = float(gamma)

    def _ensure_built(self) -> None:
        if self.gamma is not None:
            return
        if not self.devices:
            raise RuntimeError(f"{self.name}: gamma=auto needs the registered fleet before the first round")
        gamma, self.budget = choose_gamma(self.devices.values(), self.sent_bytes, self.settings.comm_s)
        self._build(gamma)

    def _shapes(self, label: str) -> dict[str, tuple[int, ...]]:
        state = self.models[label].state_dict()
        return {k: tuple(state[k].shape) for k in self.weights}

    def tensors(self, label: str) -> dict[str, np.ndarray]:
        """What a width-``label`` device receives: the leading block of every shared tensor."""
        return {k: np.ascontiguousarray(self.weights[k][leading_block(s)]) for k, s in self._shapes(label).items()}

    def setup(self, devices: Mapping[str, DeviceRecord], online: Sequence[str]) -> None:
        self._ensure_built()  # γ=auto: from the registered fleet's links

    def loaded_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` network with the current global tensors (W2 = 0 if personal)."""
        model = self.models[label]
        load_numpy_state(model, self.tensors(label), strict=not self.personal)
        return model

    # -- who trains what ----------------------------------------------------
    def assign(self, device: DeviceRecord) -> str:
        self.devices[device.device_id] = device
        return GLOBAL if self.assigner is None else self.assigner.observe(device)

    def own_train(self, train: TrainConfig) -> TrainConfig:
        """The job's training with this method's optimizer, and its own lr when it has one."""
        train = replace(train, optimizer=self.settings.optimizer)
        return train if self.settings.lr is None else replace(train, lr=self.settings.lr)

    def plan_label(self, rnd: int, device: DeviceRecord) -> str:
        if self.assigner is not None:
            return super().plan_label(rnd, device)
        label = device.label if device.label in self.specs else self.assign(device)
        self._planned[device.device_id] = label
        return label

    # -- aggregation: element-wise over the holders --------------------------
    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        metrics = self.fold_held_weights(updates)
        metrics.update(train_loss=mean_train_loss([u.update for u in updates]),
                       gamma=float(self.gamma))  # type: ignore[arg-type]
        if self.budget:
            metrics["budget_met"] = self.budget["budget_met"]
        if self.assigner is not None:
            metrics.update({f"devices_{label}": float(sum(u.update.label == label for u in updates))
                            for label in self.labels})
        return metrics

    def fold_held_weights(self, updates: list[ReceivedUpdate]) -> dict[str, float]:
        """As `WidthStrategy.fold_held_weights`; with a server optimizer, the `composed` layers' factors
        are stepped through their product (`coordinator.aggregate.composed_server`)."""
        server = self.settings.server
        if not self.composed or not server.active:
            return super().fold_held_weights(updates)
        sets = [pick(u.update.tensors, self.weights) for u in updates]
        aggregate, metrics = self.fold("weights", self.weights, sets, [u.update.num_samples for u in updates],
                                       self.settings.robust)
        self.weights, refit = composed_step(self.server_opt, server, "weights", self.composed, self.weights,
                                            aggregate)
        return {**metrics, **refit}

    # -- evaluation and export ----------------------------------------------
    def dense_model(self, label: str) -> torch.nn.Module:
        """The width-``label`` network with every factorised layer pre-composed to a dense one."""
        return precompose(self.loaded_model(label))

    def inference_model(self, label: str) -> torch.nn.Module | None:
        """pFedPara: None — each device's model holds its own W2, which the coordinator never sees."""
        return None if self.personal else super().inference_model(label)

    # -- bookkeeping --------------------------------------------------------
    def model_params(self) -> dict[str, int]:
        self._ensure_built()
        return super().model_params()

    def state_spec(self) -> dict[str, Any]:
        """The full-width network: its state names are the shared tensors' (a MiniRocket layer's
        biases among them, which the round loop fits)."""
        self._ensure_built()
        return self.global_spec

    def state_tensors(self) -> dict[str, np.ndarray]:
        self._ensure_built()
        return {**self.weights, GAMMA_KEY: np.array([self.gamma], dtype=np.float64)}

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        tensors = dict(tensors)
        stored = tensors.pop(GAMMA_KEY, None)
        if stored is None or stored.shape != (1,) or not np.isfinite(stored).all() or not 0 <= stored[0] <= 1:
            raise ValueError(f"checkpoint has no valid {GAMMA_KEY!r}; is it a {self.name} checkpoint?")
        if self.gamma != float(stored[0]):
            if self.settings.gamma is not None:
                raise ValueError(f"checkpoint was trained at gamma={float(stored[0])}, options say {self.gamma}")
            self._build(float(stored[0]))
        if set(tensors) != set(self.weights) or any(
                tuple(tensors[k].shape) != v.shape for k, v in self.weights.items()):
            raise ValueError(f"checkpoint tensors do not match this {self.name} model")
        self.weights = {k: np.asarray(v, dtype=self.weights[k].dtype) for k, v in tensors.items()}

    def method_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {**as_report(self.settings), "train": self.train_settings(GLOBAL, 0)}
        if self.gamma is not None:
            config["ranks"] = {label: layer_ranks(spec) for label, spec in self.specs.items()}
        return config


GAMMA_GRID = tuple(i / 20 for i in range(21))


def _transfer_s(nbytes: int, device: DeviceRecord) -> float:
    profile = device.profile
    return nbytes * 8 / (profile.downlink_mbps * 1e6) + nbytes * 8 / (profile.uplink_mbps * 1e6)


def choose_gamma(devices: Iterable[DeviceRecord], nbytes: Callable[[str, float], int],
                 comm_s: float, grid: Iterable[float] = GAMMA_GRID) -> tuple[float, dict[str, float]]:
    """The largest ``γ`` whose transfers fit ``comm_s`` on every device; and a summary.

    ``gamma=auto``: the largest ``γ`` on a 0.05 grid for which every registered device moves its
    plan and update (float32 bytes of the tensors that travel for its width, ``nbytes(label, γ)``)
    within ``comm_s`` at its *measured* down/uplink speed. When even ``γ = 0`` does not fit, ``γ = 0``
    is used and the budget is reported as missed. Compute does not depend on ``γ`` (layers run on
    the composed dense weight): a device's *width* comes from its FLOPS. The summary holds
    ``gamma``, ``budget_met`` (0/1) and ``worst_transfer_s``.
    """
    devices = [d for d in devices if d.label is not None]
    grid = sorted(set(grid))
    if not devices:
        raise ValueError("choose_gamma needs at least one registered device")
    best, worst = grid[0], None
    for gamma in grid:
        cost: dict[str, int] = {}
        slowest = max(_transfer_s(cost.setdefault(d.label, nbytes(d.label, gamma)), d)  # type: ignore[arg-type]
                      for d in devices)
        if gamma == grid[0]:
            worst = slowest
        if slowest <= comm_s:
            best, worst = gamma, slowest
    met = worst is not None and worst <= comm_s
    return best, {"gamma": best, "budget_met": float(met), "worst_transfer_s": float(worst or 0.0)}
