"""What every device part of a method receives and returns."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from edge_sdk.methods.settings.options import from_wire
from edge_sdk.models.spec import build_model, layer_stats
from edge_sdk.data.local_data import LocalData
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.throttle import TRAIN_FLOPS_PER_FORWARD, Throttle
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import FIXED_LAYER_TYPES, TrainConfig, TrainingStopped, TrainResult, train_local

__all__ = ["LocalData", "DeviceContext", "DeviceMethod", "compute_seconds", "plan_settings", "planned_model",
           "reused_model", "round_update"]


@dataclass(frozen=True)
class DeviceContext:
    """Who is training, where it may keep state, how it is throttled, and whether to stop."""

    device_id: str
    round: int
    seed: int = 0
    state_dir: Path | None = None
    throttle: Throttle | None = None
    #: set when the device is shutting down: training stops after the current step
    stop: threading.Event | None = None
    #: where training runs (model, batches, optimizer state); None: the CPU
    device: torch.device | None = None
    #: this device's state kept in memory between rounds (the client's own dict, one per device),
    #: for methods that keep something when there is no ``state_dir``; None: nothing is kept
    memory: dict[str, Any] | None = None

    def train(self, model: torch.nn.Module, x: np.ndarray, y: np.ndarray, config: TrainConfig,
              regularizer: Callable[[torch.nn.Module], torch.Tensor] | None = None) -> TrainResult:
        """:func:`train_local` on this device's torch device, seeded by this device and round;
        raises TrainingStopped when `stop` is set. The model is back on the CPU afterwards."""
        return train_local(model, x, y, config, seed=self.seed * 100_003 + self.round,
                           regularizer=regularizer, on_step=self._check_stop, device=self.device)

    def _check_stop(self, step: int) -> None:
        if self.stop is not None and self.stop.is_set():
            raise TrainingStopped(f"stopped after step {step} of round {self.round + 1}")


class DeviceMethod(Protocol):
    """Trains on a plan and returns the update to upload."""

    def __call__(self, plan: Plan, data: LocalData, ctx: DeviceContext) -> Update: ...


def fixed_flops(stats: list[dict]) -> int:
    """Forward FLOPs of the leading layers (`layer_stats`) whose output depends on their input alone
    (`FIXED_LAYER_TYPES`: MiniRocket's transform), which training computes once per sample."""
    total = 0
    for layer in stats:
        if layer["type"] not in FIXED_LAYER_TYPES:
            break
        total += layer["flops"]
    return total


def compute_seconds(ctx: DeviceContext, spec: dict, host_seconds: float, *, trained: int = 0,
                    forward: int = 0, distinct: int | None = None) -> float:
    """This round's compute time on the device: what it took here, or, under a throttle,
    the FLOPs of ``trained`` training samples and ``forward`` inference-only samples of
    ``spec``'s network at the profile's speed (independent of this host's speed and load).
    ``distinct``: the samples behind ``trained`` (epochs repeat them); a fixed prefix
    (`fixed_flops`) is counted once for each of them, as training computes it (None: every time)."""
    if ctx.throttle is None:
        return host_seconds
    stats = layer_stats(spec)  # one analysis of the spec: its layers' FLOPs sum to `count_flops`
    total = sum(layer["flops"] for layer in stats)
    fixed = fixed_flops(stats) if distinct is not None and trained else 0
    flops = (total - fixed) * (TRAIN_FLOPS_PER_FORWARD * trained + forward) + fixed * ((distinct or 0) + forward)
    return ctx.throttle.apply_compute(flops, host_seconds)


def plan_settings(plan: Plan, *kinds: type) -> tuple[Any, ...]:
    """The plan's training settings, a checked :class:`TrainConfig`, followed by one instance of
    each settings dataclass in ``kinds`` (:mod:`edge_sdk.methods.settings`) read from ``plan.train``:
    the device settings found there, every other with its one default — the coordinator's
    (:func:`edge_sdk.methods.settings.options.from_wire`). A bad value is a ValueError naming the
    method and the key; a key that none of them and no TrainConfig field claims is refused."""
    rest = dict(plan.train)
    found = []
    for kind in kinds:
        settings, rest = from_wire(kind, plan.method, rest)
        found.append(settings)
    return (TrainConfig.from_dict(rest), *found)


def planned_model(plan: Plan, strict: bool = True) -> torch.nn.Module:
    """The plan's network with the plan's tensors loaded."""
    model = build_model(plan.model_spec)
    load_numpy_state(model, plan.tensors, strict=strict)
    return model


_reusable = threading.local()  # per thread: (the spec, the network last built for it)


def reused_model(plan: Plan) -> torch.nn.Module:
    """`planned_model`, in the network this thread last built for the same spec (every tensor of
    it replaced by the plan's, gradients dropped), else a new one: a simulated host trains
    thousands of devices one after another on one thread, and building cnn4 took as long as a
    training step on 6 images. The caller keeps nothing of it past its round: what it sends it
    copies (``state_to_numpy(model, copy=True)``), since the next round on this thread overwrites it."""
    cached = getattr(_reusable, "model", None)
    if cached is None or cached[0] != plan.model_spec:
        model = planned_model(plan)
        _reusable.model = (plan.model_spec, model)
        return model
    model = cached[1]
    load_numpy_state(model, plan.tensors, strict=True)
    for param in model.parameters():
        param.grad = None
    return model


def round_update(plan: Plan, data: LocalData, ctx: DeviceContext, model: torch.nn.Module, result: TrainResult,
                 *, extra_seconds: float = 0.0, forward: int = 0, tensors: dict[str, np.ndarray] | None = None,
                 **metrics: float) -> Update:
    """The update of a local round: ``tensors`` (default: all of ``model``'s), the sample count,
    and the metrics every method reports (loss, steps, host seconds, the device's compute seconds
    counting ``forward`` inference-only samples) plus the method's own ``metrics``."""
    seconds = result.seconds + extra_seconds
    compute_s = compute_seconds(ctx, plan.model_spec, seconds, trained=result.samples, forward=forward,
                                distinct=len(data))
    return Update(label=plan.label, tensors=state_to_numpy(model) if tensors is None else tensors,
                  num_samples=len(data),
                  metrics={"loss": result.loss, "train_seconds": seconds, "compute_s": compute_s,
                           "steps": float(result.steps), **metrics})
