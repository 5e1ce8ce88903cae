"""FDNNC (Li et al., IEEE IoT Journal 2022): dense FC layers on big devices, A Bᵀ on small ones.

Big devices (measured GFLOPS and RAM at or above the thresholds) train the dense
network; small devices train a copy whose big fully-connected layers are rank-r
projections ``W ≈ A Bᵀ`` (:mod:`edge_sdk.models.lowrank`; a MiniRocket head folded by
kernel, the inputs after its kernels' a dense ``tail`` of the small model's own, averaged
over the small devices). Every other tensor (biases, convs, a small classifier) is shared
by both models and averaged over everyone who trained it. After any aggregation the server
holds a consistent pair: W for big devices, ``A, B`` (and a tail) for small ones:

- big and small updates: ``W⁺ = (A Bᵀ + W) / 2``, then ``A, B = SVD_r(W⁺)``;
- only big updates: ``W⁺ = W``, then ``A, B = SVD_r(W⁺)`` (decompose);
- only small updates: ``W⁺ = A⁺ B⁺ᵀ`` (compose).

The training pattern decides who trains when: ``both`` (everyone, every round),
``bfirst`` (big devices for ``big_rounds`` rounds, then small devices fine-tune)
and ``switch`` (each round two stages: big devices, then small devices from the
decomposition). Under ``upload=half`` (CEFO) half of a round's small devices
upload only their A factors and the other half only B (plus the shared tensors and a tail);
each factor is averaged over the devices that sent it. With ``half_split=rounds``
every small device sends A in even rounds and B in odd ones instead.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from edge_sdk.methods.settings.fdnnc import FdnncRound, FdnncSettings
from edge_sdk.methods.settings.options import as_report
from edge_sdk.models.lowrank import compose_layer, decompose_layer, lowrank_layers, lowrank_spec
from edge_sdk.models.spec import build_model, count_params, validate_spec
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_keys, state_to_numpy

from coordinator.aggregate.averaging import mean_train_loss
from coordinator.core.tensor_groups import restore_groups
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import pick
from coordinator.core.federation import EvalData, FederationConfig
from coordinator.strategies.base import Strategy, StrategyContext, seeded_init
from coordinator.aggregate.validation import TensorSpec, UpdateRejected, expected_from, validate_update

__all__ = ["Fdnnc", "fdnnc_dense_spec", "BIG", "SMALL"]

BIG, SMALL = "big", "small"
FACTORS = "factors/"  # the prefix of the small model's factors in the strategy's state


def fdnnc_dense_spec(family: str, input_shape: tuple[int, ...], num_classes: int,
                     hidden: tuple[int, ...]) -> dict:
    """The zoo model of ``family`` with its classifier replaced by an FC head of ``hidden`` widths.

    For ``mlp`` this is the plain MLP ``in-hidden...-classes`` (every parameter in FC layers).
    """
    base = model_for_dataset(family, input_shape, num_classes, **({"hidden": ()} if family == "mlp" else {}))
    *trunk, last = base["layers"]
    if last.get("type") != "linear":
        raise ValueError(f"fdnnc needs a model ending in a linear classifier, {family!r} does not")
    head, cin = [], last["in"]
    for width in hidden:
        head += [{"type": "linear", "in": cin, "out": width}, {"type": "relu"}]
        cin = width
    head.append({"type": "linear", "in": cin, "out": num_classes})
    name = f"{base['name']}-fc{'-'.join(str(h) for h in hidden)}" if hidden else base["name"]
    return validate_spec({**base, "layers": [*trunk, *head], "name": name})


class Fdnnc(Strategy):
    """Dense and low-rank models trained together under a BOTH, BFIRST or SWITCH pattern."""

    name = "fdnnc"

    @classmethod
    def describe_label(cls, label: str) -> str:
        return {BIG: "big (dense)", SMALL: "small (low-rank)"}.get(label, label)

    def __init__(self, config: FederationConfig, options: FdnncSettings, dense_spec: dict) -> None:
        super().__init__(config)
        self.settings = options
        self.dense_spec = dense_spec
        self.small_spec = lowrank_spec(dense_spec, options.rank)
        self.lowrank = lowrank_layers(dense_spec, options.rank)
        with seeded_init(config.seed):
            self.big_model = build_model(dense_spec)
            self.small_model = build_model(self.small_spec)
        self.dense = {k: np.array(v) for k, v in state_to_numpy(self.big_model).items()}
        self.factors: dict[str, np.ndarray] = {}
        self._decompose()
        self.shared = [k for k in state_keys(self.small_model) if k not in self.factors]
        self.a_names = [f"layers.{i}.A" for i in self.lowrank]
        self.b_names = [f"layers.{i}.B" for i in self.lowrank]
        #: a folded layer's dense columns after its blocks (`edge_sdk.models.folding`): small devices' own
        self.tail_names = [f"layers.{i}.tail" for i in self.lowrank if f"layers.{i}.tail" in self.factors]
        self._records: dict[str, DeviceRecord] = {}
        self._asked: dict[str, str] = {}  # device -> upload mode of the open stage
        self._active: tuple[str, ...] = (BIG, SMALL)
        self._floor: tuple[float, int] | None = None  # weakest big device under big_fraction

    @classmethod
    def create(cls, ctx: StrategyContext) -> "Fdnnc":
        options = cls.parse_options(ctx.options)
        # MiniRocket's head is its classifier alone (factorised folded by kernel), unless a head is asked for
        if ctx.model_family == "minirocket" and "hidden" not in (ctx.options or {}):
            options = replace(options, hidden=())
        spec = fdnnc_dense_spec(ctx.model_family, tuple(ctx.input_shape), ctx.num_classes, options.hidden)
        return cls(cls.method_federation(ctx, options), options, spec)

    # -- tensors ------------------------------------------------------------
    def _decompose(self) -> None:
        for i in self.lowrank:
            a, b, tail = decompose_layer(self.dense[f"layers.{i}.weight"], self.small_spec["layers"][i])
            self.factors[f"layers.{i}.A"], self.factors[f"layers.{i}.B"] = a, b
            if tail is not None:
                self.factors[f"layers.{i}.tail"] = tail

    def _composed(self, i: int) -> np.ndarray:
        """The dense weight of low-rank layer ``i`` from its factors (and tail)."""
        return compose_layer(self.factors[f"layers.{i}.A"], self.factors[f"layers.{i}.B"],
                             self.factors.get(f"layers.{i}.tail"), self.small_spec["layers"][i])

    def _compose(self) -> None:
        for i in self.lowrank:
            self.dense[f"layers.{i}.weight"] = self._composed(i)

    def small_tensors(self) -> dict[str, np.ndarray]:
        """What a small device loads: the factors and the shared tensors."""
        return {**{k: self.dense[k] for k in self.shared}, **self.factors}

    def expected(self, label: str, mode: str) -> dict[str, TensorSpec]:
        """The exact tensors an update of `label` uploaded in `mode` must hold."""
        if label == BIG:
            return expected_from(self.dense)
        dropped = set(self.b_names if mode == "a" else self.a_names if mode == "b" else [])
        return expected_from({k: v for k, v in self.small_tensors().items() if k not in dropped})

    # -- who is big ---------------------------------------------------------
    @staticmethod
    def _capacity(device: DeviceRecord) -> tuple[float, int]:
        return (device.profile.gflops, device.profile.ram_mb)

    def assign(self, device: DeviceRecord) -> str:
        self._records[device.device_id] = device
        if self._floor is not None:
            return BIG if self._capacity(device) >= self._floor else SMALL
        big = device.profile.gflops >= self.settings.big_gflops and device.profile.ram_mb >= self.settings.big_ram_mb
        return BIG if big else SMALL

    def _fix_fraction(self, registered: Mapping[str, DeviceRecord]) -> dict[str, str]:
        """Under `big_fraction`: the round(F * N) most capable registered devices are big; returns
        every registered device's label."""
        devices = sorted(registered.values(), key=lambda d: (*self._capacity(d), d.device_id), reverse=True)
        n_big = int(math.floor(self.settings.big_fraction * len(devices) + 0.5))
        self._floor = self._capacity(devices[n_big - 1]) if n_big else (math.inf, 0)
        return {device.device_id: BIG if k < n_big else SMALL for k, device in enumerate(devices)}

    # -- scheduling ---------------------------------------------------------
    def stages(self, rnd: int, present: set[str]) -> list[tuple[str, ...]]:
        """The groups that train, stage by stage, in round `rnd` (groups absent from the fleet skipped)."""
        pattern = self.settings.pattern
        if pattern == "both" or not present:
            return [(BIG, SMALL)]
        if pattern == "switch":
            return [(g,) for g in (BIG, SMALL) if g in present]
        big_rounds = self.settings.big_rounds if self.settings.big_rounds is not None else self.config.rounds // 2
        wanted = BIG if rnd < big_rounds else SMALL
        return [(wanted,)] if wanted in present else [tuple(present)]

    def setup(self, devices: Mapping[str, DeviceRecord], online: Sequence[str]) -> dict[str, str] | None:
        if self.settings.big_fraction is not None and self._floor is None:
            return self._fix_fraction(devices)  # the round loop labels the devices
        return None

    def round_stages(self, rnd: int, online: Sequence[DeviceRecord]) -> list[tuple[str, ...]]:
        return self.stages(rnd, {d.label for d in online if d.label is not None})

    def begin_stage(self, rnd: int, stage: tuple[str, ...]) -> None:
        self._active = stage

    def candidates(self, online: list[str]) -> list[str]:
        return [d for d in online if self._records[d].label in self._active]

    def begin_round_plans(self, rnd: int, participants: list[str]) -> None:
        """What each participant uploads: everything, or with ``upload=half`` a small device's A or B."""
        small = [d for d in participants if self._records[d].label == SMALL]
        self._asked = {d: "full" for d in participants}
        if self.settings.upload == "half":
            for k, device_id in enumerate(small):  # alternate A/B; a device switches every round
                turn = rnd if self.settings.half_split == "rounds" else k + rnd
                self._asked[device_id] = "a" if turn % 2 == 0 else "b"

    # -- round hooks --------------------------------------------------------
    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        mode = self._asked.setdefault(device.device_id, "full")
        if device.label == BIG:
            return Plan(method=self.device_part(), label=BIG, model_spec=self.dense_spec, tensors=self.dense,
                        train=self.plan_train(rnd, FdnncRound(upload="full", freeze=False)))
        asked = FdnncRound(upload=mode, freeze=self.settings.freeze and mode != "full")
        return Plan(method=self.device_part(), label=SMALL, model_spec=self.small_spec, tensors=self.small_tensors(),
                    train=self.plan_train(rnd, asked))

    def configure_evaluate(self, rnd: int, device: DeviceRecord) -> Plan | None:
        """The dense model on a big device, the low-rank one on a small device; nothing recorded."""
        settings = self.plan_train(rnd, FdnncRound(upload="full", freeze=False))
        if device.label == BIG:
            return Plan(method=self.device_part(), label=BIG, model_spec=self.dense_spec, tensors=self.dense,
                        train=settings)
        return Plan(method=self.device_part(), label=SMALL, model_spec=self.small_spec, tensors=self.small_tensors(),
                    train=settings)

    def check_update(self, device: DeviceRecord, update: Update) -> None:
        mode = self._asked.get(device.device_id)
        if mode is None or device.label is None:
            raise UpdateRejected("not_asked", f"{device.device_id} was sent no plan in this stage")
        validate_update(update, self.expected(device.label, mode), device.label, device.num_samples)

    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        big = [u.update for u in updates if u.update.label == BIG]
        small = [u.update for u in updates if u.update.label == SMALL]
        everyone = big + small
        # The rule folds each group; the server optimizer, if any, steps the composed dense model
        # once at the end (factors are re-derived from it by SVD, so their own moments would be
        # meaningless from one decomposition to the next).
        robust, server = self.settings.robust, self.settings.server
        before = dict(self.dense)

        screened: dict[str, float] = {}

        def fold(group: str, current: dict[str, np.ndarray], senders: list[Update]) -> dict[str, np.ndarray]:
            folded, metrics = self.fold(group, current, [pick(u.tensors, current) for u in senders],
                                        [u.num_samples for u in senders], robust)
            if "clipped" in metrics:  # updates the screen scaled back, over every group
                screened["clipped"] = screened.get("clipped", 0.0) + metrics["clipped"]
            return folded

        self.dense.update(fold("shared", {k: self.dense[k] for k in self.shared}, everyone))
        w_names = [f"layers.{i}.weight" for i in self.lowrank]
        new_w = fold(BIG, {k: self.dense[k] for k in w_names}, big) if big else {}
        for name in self.a_names + self.b_names + self.tail_names:  # each factor over the devices that sent it
            senders = [u for u in small if name in u.tensors]
            if senders:  # a group of its own: its trusted norm is its own, not another factor's
                self.factors[name] = fold(f"factor {name}", {name: self.factors[name]}, senders)[name]
        share_big = 0.5
        if self.settings.both_weight == "samples" and big and small:
            n_big = sum(u.num_samples for u in big)
            share_big = n_big / (n_big + sum(u.num_samples for u in small))
        if small and not big:
            self._compose()
        else:
            for i, w in enumerate(w_names):
                self.dense[w] = new_w[w]
                if small:
                    low = self._composed(self.lowrank[i])
                    self.dense[w] = (share_big * new_w[w] + (1 - share_big) * low.astype(np.float64)
                                     ).astype(np.float32)
            self._decompose()
        if server.active:
            self.dense = self.server_opt.step(server, "dense", before, self.dense)
            self._decompose()
        return {**self._metrics(big, small), **screened}

    def _metrics(self, big: list[Update], small: list[Update]) -> dict[str, float]:
        factor_names = set(self.a_names + self.b_names)
        metrics = {"n_big": float(len(big)), "n_small": float(len(small)),
                   "up_params_big": float(sum(a.size for u in big for a in u.tensors.values())),
                   "up_params_small": float(sum(a.size for u in small for a in u.tensors.values())),
                   "up_factor_params_small": float(sum(a.size for u in small for k, a in u.tensors.items()
                                                       if k in factor_names))}
        for label, group in ((BIG, big), (SMALL, small)):
            if group:
                metrics[f"train_loss_{label}"] = mean_train_loss(group)
        return metrics

    def evaluate(self, rnd: int, data: EvalData) -> tuple[dict[str, float], float]:
        load_numpy_state(self.big_model, self.dense)
        load_numpy_state(self.small_model, self.small_tensors())
        acc_big, loss_big = self.evaluate_model(self.big_model, data)
        acc_small, loss_small = self.evaluate_model(self.small_model, data)
        return {BIG: acc_big, SMALL: acc_small}, (loss_big + loss_small) / 2

    def inference_model(self, label: str) -> torch.nn.Module | None:
        """Big devices: the dense network; small ones: the low-rank network they trained."""
        if label == BIG:
            load_numpy_state(self.big_model, self.dense)
            return self.big_model
        if label == SMALL:
            load_numpy_state(self.small_model, self.small_tensors())
            return self.small_model
        return None

    def model_params(self) -> dict[str, int]:
        return {BIG: count_params(self.dense_spec), SMALL: count_params(self.small_spec)}

    def state_spec(self) -> dict[str, Any]:
        """The dense network: its tensors are the state's under their own names (a MiniRocket layer's
        biases among them, which the round loop fits)."""
        return self.dense_spec

    def state_tensors(self) -> dict[str, np.ndarray]:
        return {**self.dense, **{f"{FACTORS}{k}": v for k, v in self.factors.items()}}

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        grouped = any(k.startswith("dense/") for k in tensors)  # a checkpoint from before 2026-11-30
        if not grouped:
            tensors = {k if k.startswith(FACTORS) else f"dense/{k}": v for k, v in tensors.items()}
        groups = restore_groups(tensors, {"dense": self.dense, "factors": self.factors}, "fdnnc model")
        self.dense, self.factors = groups["dense"], groups["factors"]

    def method_config(self) -> dict[str, Any]:
        return {**as_report(self.settings), "lowrank_layers": self.lowrank, "dense_spec": self.dense_spec,
                "small_spec": self.small_spec}
