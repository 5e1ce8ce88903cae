"""REFT (Desai, Hilal, Eldardiry 2024): variable pruning by measured FLOPS + one-shot distillation.

Every device gets the initial global model pruned to its capacity (``P = max(0, 1 - F/F_lambda)``,
rounded up to a level; :mod:`coordinator.strategies.pruning`), trains it on its private data and uploads only
its logits on a public unlabeled set and its per-class sample counts. The coordinator ensembles the
logits with per-class importance weights and distils them into the unpruned global model
(:mod:`coordinator.strategies.distillation`). One round by default; with ``oneshot=false`` every further
round sends the distilled model back, pruned per device, and distils again.

The public set travels once per device, in its first plan (uint8, float16 for series: `public_dtype`;
counted in the bytes); later plans name it by digest. After the last round each device is published
its level's model, the global model pruned and distilled again (`Reft.level_tensors`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np
import torch

from edge_sdk.methods.reft import FLOAT16_MAX, decode_public, dequantize_logits, encode_public, public_digest
from edge_sdk.methods.settings.options import as_report, schema
from edge_sdk.methods.settings.reft import ReftRound, ReftSettings
from edge_sdk.methods.settings.shared import ServerOptConfig, clip_factor
from edge_sdk.models.kernel_subset import is_minirocket
from edge_sdk.models.spec import build_model, count_params
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig

from coordinator.strategies.distillation import DistillConfig, DistillResult, distill, ensemble_logits, screen_scales
from coordinator.aggregate.averaging import mean_train_loss
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.strategies.pruning import (KERNEL_SUBSET, PruneResult, capacity_level, describe_level, level_label,
                                           prune_spec, resolve_backend)
from coordinator.core.federation import EvalData, FederationConfig
from coordinator.strategies.base import Strategy, StrategyContext, seeded_init
from coordinator.aggregate.validation import TensorSpec, UpdateRejected, expected_from, validate_update

__all__ = ["Reft", "GLOBAL"]

log = logging.getLogger(__name__)
GLOBAL = "global"
_VERSION = "reft/version"
_TEACHER = "reft/teacher"
_OLD_GLOBAL = "global/"  # the global model's names in older checkpoints


@dataclass(frozen=True)
class _Sent:
    label: str
    level: float
    spec: dict


def public_dtype(chosen: str, public_x: np.ndarray) -> str:
    """How the public inputs travel: as ``chosen``; ``auto``: ``float16`` for series ``(N, C, L)`` (one
    ``uint8`` range per channel over the set leaves a small appliance's current a few levels) whose values
    float16 holds, else ``uint8``."""
    if chosen != "auto":
        return chosen
    return "float16" if np.ndim(public_x) == 3 and float(np.abs(public_x).max()) <= FLOAT16_MAX else "uint8"


class Reft(Strategy):
    """Pruned models out, logits back, importance-weighted distillation into the global model."""

    name = "reft"
    spec_file_support = ("prunes the spec file's conv2d and linear layers (structured, by filters/units); the "
                         "other layers follow their shapes; a minirocket spec keeps its first kernels' features")
    needs_public_data = True

    @classmethod
    def describe_label(cls, label: str) -> str:
        return describe_level(label)

    def __init__(self, config: FederationConfig, options: ReftSettings, spec: dict, public_x: np.ndarray) -> None:
        super().__init__(config)
        self.settings = options
        self.spec = spec
        # a MiniRocket model keeps a prefix of its kernels: no pruning library needed
        self.backend = KERNEL_SUBSET if is_minirocket(spec) else resolve_backend(options.backend)
        with seeded_init(config.seed):
            self.model = build_model(spec)
        self.weights = state_to_numpy(self.model, copy=True)
        if options.public_samples is not None and options.public_samples < len(public_x):
            keep = np.random.default_rng(config.seed + 17).choice(len(public_x), options.public_samples,
                                                                   replace=False)
            public_x = public_x[np.sort(keep)]
        self.public_encoding = public_dtype(options.public_dtype, public_x)
        self.public = encode_public(public_x, self.public_encoding)
        self.digest = public_digest(self.public)
        self.public_x = decode_public(self.public)  # exactly what devices compute logits on
        if self.public_x.shape[1:] != tuple(spec["input_shape"]):
            raise ValueError(f"public inputs have shape {self.public_x.shape[1:]}, the model "
                             f"expects {tuple(spec['input_shape'])}")
        self.version = 0
        self.levels: dict[str, float] = {}  # device -> pruning level
        self.last_distill: DistillResult | None = None
        #: the last teacher logits on the public inputs (zeros before the first distillation): the levels'
        #: models, published and evaluated on the devices, are distilled from it (`level_tensors`)
        self.teacher = np.zeros((len(self.public_x), int(spec["num_classes"])), dtype=np.float32)
        self._taught = False  # whether `teacher` is a distillation's (a checkpoint of before it was kept: no)
        #: (version, level) -> the tensors of that level's model (`level_tensors`), of the versions last asked
        self._level_models: dict[tuple[int, float], dict[str, np.ndarray]] = {}
        self._pruned: dict[float, PruneResult] = {}  # level -> pruned current global model
        self._params: dict[float, int] = {0.0: count_params(spec)}
        self._has_public: set[str] = set()
        self._sent: dict[str, _Sent] = {}
        self._device_models: dict[str, tuple[_Sent, dict[str, np.ndarray]]] = {}

    @classmethod
    def parse_options(cls, options: Mapping[str, str]) -> ReftSettings:
        server = sorted(set(options) & set(schema(ServerOptConfig).keys))
        if server:
            raise ValueError(f"reft: {server} need a method that averages weights; REFT distils the devices' "
                             f"logits into its model (against outliers: aggregate=median)")
        return super().parse_options(options)

    @classmethod
    def create(cls, ctx: StrategyContext) -> "Reft":
        options = cls.parse_options(ctx.options)
        if ctx.public_data is None or len(ctx.public_data) == 0:
            raise ValueError("reft distils on a public unlabeled set: the context has none "
                             "(simulation holds out public_fraction of the training inputs)")
        federation = cls.method_federation(ctx, options)
        if options.oneshot and federation.rounds != 1:
            log.warning("reft is one-shot: running 1 round, not %d (--option oneshot=false for further "
                        "rounds that send the distilled model back)", federation.rounds)
            federation = replace(federation, rounds=1)
        spec = model_for_dataset(ctx.model_family, ctx.input_shape, ctx.num_classes)
        return cls(federation, options, spec, np.asarray(ctx.public_data))

    # -- pruning ------------------------------------------------------------
    def pruned(self, level: float) -> PruneResult:
        """The current global model pruned to ``level`` (computed once per level and version)."""
        if level not in self._pruned:
            result = prune_spec(self.spec, self.weights, level, self.backend)
            log.info("reft: pruned to %s with %s: %d params", level_label(level), result.backend, result.params)
            self._pruned[level] = result
            self._params[level] = result.params
        return self._pruned[level]

    def begin_round_plans(self, rnd: int, participants: list[str]) -> None:
        """The participants' levels are pruned now, before the round is announced.

        NNI traces with ``torch.fx``, which patches ``nn.Module.__call__`` process-wide while it
        runs: in a simulation it must not overlap devices already training in other threads.
        """
        for device_id in participants:
            if device_id in self.levels:
                self.pruned(self.levels[device_id])

    def assign(self, device: DeviceRecord) -> str:
        level = capacity_level(device.profile.gflops, self.settings.f_lambda, self.settings.levels)
        self.levels[device.device_id] = level
        return level_label(level)

    # -- round hooks --------------------------------------------------------
    def own_train(self, train: TrainConfig) -> TrainConfig:
        """The job's training with REFT's local optimizer, lr and epochs."""
        return self.settings.local_train(train)

    def configure_train(self, rnd: int, device: DeviceRecord) -> Plan:
        level = self.levels.get(device.device_id)
        if level is None:
            level = capacity_level(device.profile.gflops, self.settings.f_lambda, self.settings.levels)
            self.levels[device.device_id] = level
        pruned = self.pruned(level)
        tensors = dict(pruned.tensors)
        if device.device_id not in self._has_public:
            tensors.update(self.public)
        sent = _Sent(level_label(level), level, pruned.spec)
        self._sent[device.device_id] = sent
        return Plan(method=self.device_part(), label=sent.label, model_spec=pruned.spec, tensors=tensors,
                    train=self.plan_train(rnd, ReftRound(public_digest=self.digest)))

    def configure_evaluate(self, rnd: int, device: DeviceRecord) -> Plan | None:
        """The model of ``device``'s level, the one it is published (`level_tensors`), without the public
        set; nothing recorded."""
        level = self.levels.get(device.device_id)
        if level is None:
            return None
        pruned = self.pruned(level)
        return Plan(method=self.device_part(), label=level_label(level), model_spec=pruned.spec,
                    tensors=dict(self.level_tensors(level)), train=self.plan_train(rnd))

    def expected(self, level: float) -> dict[str, TensorSpec]:
        """The exact tensors an update of a device at ``level`` must hold."""
        n, classes = len(self.public_x), int(self.spec["num_classes"])
        out = {"logits": TensorSpec((n, classes), self.settings.logits_dtype),
               "counts": TensorSpec((classes,), "int64")}
        if self.settings.logits_dtype == "int8":
            out["logits.scale"] = TensorSpec((n,), "float32")
        if self.settings.device_eval:
            out.update(expected_from(self.pruned(level).tensors))
        return out

    def check_update(self, device: DeviceRecord, update: Update) -> None:
        sent = self._sent.get(device.device_id)
        if sent is None:
            raise UpdateRejected("not_asked", f"{device.device_id} was sent no reft plan")
        validate_update(update, self.expected(sent.level), sent.label, device.num_samples)
        counts = update.tensors["counts"]
        if (counts < 0).any() or int(counts.sum()) != update.num_samples:
            raise UpdateRejected("bad_counts", f"class counts must be >= 0 and sum to num_samples="
                                 f"{update.num_samples}, got sum {int(counts.sum())}")
        if "logits.scale" in update.tensors and (update.tensors["logits.scale"] <= 0).any():
            raise UpdateRejected("bad_scale", "int8 logit scales must be > 0")
        self._has_public.add(device.device_id)

    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        logits = [dequantize_logits(u.update.tensors) for u in updates]
        counts = np.stack([u.update.tensors["counts"] for u in updates])
        clip = clip_factor(self.settings.clip)
        teacher = ensemble_logits(logits, counts, self.settings.aggregate, clip_factor=clip,
                                  max_share=self.settings.max_share)
        if self.settings.device_eval:
            self._device_models = {u.device_id: (self._sent[u.device_id], {
                k: v for k, v in u.update.tensors.items() if k.startswith("layers.")}) for u in updates}
        load_numpy_state(self.model, self.weights)
        self.last_distill = distill(self.model, self.public_x, teacher, self._distill_config(rnd))
        self.weights = state_to_numpy(self.model, copy=True)
        self.teacher = np.asarray(teacher, dtype=np.float32)
        self._taught = True
        self.version += 1
        self._pruned.clear()
        return {"train_loss": mean_train_loss([u.update for u in updates]),
                "distill_loss": self.last_distill.loss, "distill_agreement": self.last_distill.agreement,
                "distill_seconds": self.last_distill.seconds, "teachers": float(len(updates)),
                "classes_covered": float((counts.sum(axis=0) > 0).sum()),
                "teachers_clipped": 0.0 if clip is None else float(np.sum(screen_scales(logits, clip) < 1.0))}

    def _distill_config(self, rnd: int) -> DistillConfig:
        return DistillConfig(temperature=self.settings.temperature, lr=self.settings.distill_lr,
                             epochs=self.settings.distill_epochs, batch_size=self.settings.distill_batch,
                             seed=self.config.seed + rnd)

    def level_tensors(self, level: float) -> dict[str, np.ndarray]:
        """The model a device of ``level`` runs (published, and evaluated on the devices): the global model
        pruned to it and distilled, as the global model was, from the last teacher on the public inputs (a
        pruned classifier keeps columns that were fitted beside the others: on PLAID's MiniRocket head at
        p0.9 0.389 as cut, 0.613 distilled). The dense level, and every level before the first distillation,
        as pruned. Kept per version: a serving job compares the published version's with the new one's."""
        pruned = self.pruned(level)
        if level == 0 or self.version == 0 or not self._taught:
            return pruned.tensors
        key = (self.version, level)
        if key not in self._level_models:
            model = build_model(pruned.spec)
            load_numpy_state(model, pruned.tensors)
            distill(model, self.public_x, self.teacher, self._distill_config(self.version))
            if len(self._level_models) >= 2 * len(set(self.levels.values())):  # two versions' levels: the oldest out
                del self._level_models[next(iter(self._level_models))]
            self._level_models[key] = state_to_numpy(model, copy=True)
        return self._level_models[key]

    def inference_model(self, label: str) -> torch.nn.Module | None:
        """A device's published model: its level's (`level_tensors`); None for a label no device holds,
        or before the first distillation."""
        level = next((lv for lv in set(self.levels.values()) if level_label(lv) == label), None)
        if level is None or self.version == 0:
            return None
        model = build_model(self.pruned(level).spec)
        load_numpy_state(model, self.level_tensors(level))
        return model.eval()

    def evaluate(self, rnd: int, data: EvalData) -> tuple[dict[str, float], float]:
        load_numpy_state(self.model, self.weights)
        accuracy, loss = self.evaluate_model(self.model, data)
        result = {GLOBAL: accuracy}
        per_label: dict[str, list[float]] = {}
        for sent, tensors in self._device_models.values():
            model = build_model(sent.spec)
            load_numpy_state(model, tensors)
            per_label.setdefault(sent.label, []).append(self.evaluate_model(model, data)[0])
        result.update({label: float(np.mean(accs)) for label, accs in sorted(per_label.items())})
        return result, loss

    def model_params(self) -> dict[str, int]:
        out = {GLOBAL: count_params(self.spec)}
        for level in sorted(set(self.levels.values())):
            if level not in self._params:
                self.pruned(level)
            out[level_label(level)] = self._params[level]
        return out

    def state_tensors(self) -> dict[str, np.ndarray]:
        """The global model under its own names (`state_spec`'s), the distillations done, the last teacher."""
        return {**self.weights, _VERSION: np.array([self.version], dtype=np.int64), _TEACHER: self.teacher}

    def state_spec(self) -> dict[str, Any]:
        """The global (unpruned) network: its MiniRocket biases are fitted by the round loop."""
        return self.spec

    def load_state_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        if any(k.startswith(_OLD_GLOBAL) for k in tensors):  # an older checkpoint: the model under global/NAME
            tensors = {k.removeprefix(_OLD_GLOBAL) if k.startswith(_OLD_GLOBAL) else k: v for k, v in tensors.items()}
        tensors = {_TEACHER: np.zeros_like(self.teacher), **tensors}  # older checkpoints kept no teacher
        if set(tensors) != set(self.weights) | {_VERSION, _TEACHER} or np.shape(tensors[_VERSION]) != (1,) or any(
                np.shape(tensors[k]) != v.shape for k, v in [*self.weights.items(), (_TEACHER, self.teacher)]):
            raise ValueError("checkpoint tensors do not match this reft model")
        self.weights = {k: np.asarray(tensors[k], dtype=v.dtype) for k, v in self.weights.items()}
        self.version = int(tensors[_VERSION][0])
        self.teacher = np.asarray(tensors[_TEACHER], dtype=np.float32)
        self._taught = bool(np.any(self.teacher))  # zeros: before the first distillation, or an older checkpoint
        self._pruned.clear()
        self._has_public.clear()  # devices may have lost it: resend

    def method_config(self) -> dict[str, Any]:
        return {**as_report(self.settings), "public_dtype": self.public_encoding, "pruning_backend": self.backend,
                "model_spec": self.spec,
                "public_samples": int(len(self.public_x)),
                "public_bytes": int(sum(a.nbytes for a in self.public.values())),
                "rounds": self.config.rounds}
