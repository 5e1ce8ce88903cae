"""REFT's server side of knowledge distillation: importance-weighted teacher, KL-trained student.

Each device ``t`` reports logits ``z_t`` on the shared public inputs and its per-class sample
counts ``N_c^t``. A class's importance for a device is its share of that class over the
devices that report it, ``I_c^t = N_c^t / sum_t' N_c^t'``, so each class's weights sum to 1
(a class nobody holds gets uniform weights, never 0/0). The teacher logit of class ``c`` is
``sum_t I_c^t z_t[:, c]``. The student (the unpruned global model) is trained on the public
inputs alone with ``T^2 KL(softmax(teacher / T) || softmax(student / T))`` and Adam.

``rule="median"`` (robust against a device sending poisoned logits): each device's logits are
first centred per sample (softmax ignores a per-sample shift), then the teacher logit is the
``I_c^t``-weighted median over devices instead of the weighted sum.

Against one hostile device the teacher also takes the defences of weight averaging
(`coordinator.aggregate.robust`), in the form logits need: once three or more devices hold a class,
none keeps more than ``max_share`` of that class's importance; and with ``clip_factor`` K no
device's logits (the whole ``(N, classes)`` matrix, as sent) may be longer than K times the
longest of the *other* devices' logits — a longer one is scaled back to that bound, and its
importance for every class by the same factor, so that an upload many times too long fades out.

The bound is the longest other device, not the median of the round (as weight averaging uses):
honest teachers' logits differ in length by two orders of magnitude — a model pruned to P = 0.9
that learnt little sends near-uniform logits, a dense one confident ones — so the median of a
fleet of mostly small devices scaled the few informative teachers back to a fraction of their
length and weight (REFT's default job: 0.672 -> 0.203; BENCHMARKS.md, issue 56). Against the
longest other device an honest fleet is screened only where one device is more than K times
longer than every other; one hostile device is never longer than K times the longest honest one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.training import trained_part

from coordinator.aggregate.averaging import capped_shares

__all__ = ["DistillConfig", "DistillResult", "class_importance", "capped_importance", "longest_other",
           "screen_scales", "ensemble_logits", "distill"]


@dataclass(frozen=True)
class DistillConfig:
    """Server-side distillation settings."""

    temperature: float = 3.0
    lr: float = 1e-3
    epochs: int = 60
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name, lo, hi in (("temperature", 0.05, 100.0), ("lr", 1e-7, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not lo <= value <= hi:
                raise ValueError(f"distillation {name} must be in [{lo:g}, {hi:g}], got {value!r}")
        for name, hi in (("epochs", 100_000), ("batch_size", 65_536)):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= hi:
                raise ValueError(f"distillation {name} must be an int in [1, {hi}], got {value!r}")


@dataclass(frozen=True)
class DistillResult:
    """Mean KL loss of the last epoch, steps, seconds, and how often the student's top class
    agrees with the teacher's on the public inputs afterwards."""

    loss: float
    steps: int
    seconds: float
    agreement: float


def class_importance(counts: np.ndarray) -> np.ndarray:
    """``(devices, classes)`` sample counts -> weights whose every column sums to 1."""
    n = np.asarray(counts, dtype=np.float64)
    if n.ndim != 2 or n.shape[0] < 1 or n.shape[1] < 1:
        raise ValueError(f"counts must be a (devices, classes) array, got shape {n.shape}")
    if not np.isfinite(n).all() or (n < 0).any():
        raise ValueError("counts must be finite and non-negative")
    total = n.sum(axis=0, keepdims=True)
    uniform = np.full_like(n, 1.0 / n.shape[0])
    return np.where(total > 0, n / np.where(total > 0, total, 1.0), uniform)


def _weighted_median(stack: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per ``(n, c)``: the value over devices (axis 0) where the weights ``(devices, c)`` pass half."""
    order = np.argsort(stack, axis=0)
    values = np.take_along_axis(stack, order, 0)
    w = np.take_along_axis(np.broadcast_to(weights[:, None, :], stack.shape), order, 0)
    cum = np.cumsum(w, axis=0)
    first = np.argmax(cum >= 0.5 * cum[-1:] - 1e-12, axis=0)  # the first device past half the weight
    return np.take_along_axis(values, first[None], 0)[0]


def capped_importance(counts: np.ndarray, max_share: float) -> np.ndarray:
    """:func:`class_importance` with every class held by three or more devices capped so that no
    device keeps more than ``max_share`` of it (`coordinator.aggregate.averaging.capped_shares`)."""
    weights = class_importance(counts)
    n = np.asarray(counts, dtype=np.float64)
    for c in range(weights.shape[1]):
        holders = n[:, c] > 0
        if holders.sum() >= 3 and max_share < 1.0:
            column = np.zeros(len(n))
            column[holders] = capped_shares(n[holders, c], max_share)
            weights[:, c] = column / column.sum()
    return weights


def longest_other(norms: np.ndarray) -> np.ndarray:
    """Per device, the largest of the *other* devices' norms (``inf`` for a device alone)."""
    norms = np.asarray(norms, dtype=np.float64)
    if len(norms) < 2:
        return np.full(len(norms), np.inf)
    order = np.argsort(norms)
    out = np.full(len(norms), norms[order[-1]])
    out[order[-1]] = norms[order[-2]]
    return out


def screen_scales(logits: Sequence[np.ndarray] | np.ndarray, clip_factor: float) -> np.ndarray:
    """Per device, the factor the screen scales its logits by (1: untouched): ``clip_factor``
    times the longest other device's norm over its own, at most 1."""
    norms = np.sqrt(np.array([np.vdot(z, z) for z in np.asarray(logits, dtype=np.float64)]))
    return np.minimum(1.0, clip_factor * longest_other(norms) / np.maximum(norms, 1e-300))


def ensemble_logits(logits: Sequence[np.ndarray], counts: np.ndarray, rule: str = "mean",
                    clip_factor: float | None = None, max_share: float = 1.0) -> np.ndarray:
    """Teacher logits: per class, the importance-weighted sum (``mean``) or weighted median
    (``median``, of per-sample centred logits) of the devices' logits; ``clip_factor`` and
    ``max_share``: the screen and importance cap of the module doc."""
    if rule not in ("mean", "median"):
        raise ValueError(f"teacher rule must be mean or median, got {rule!r}")
    if len(logits) == 0 or len(logits) != len(counts):
        raise ValueError("need one logits array per row of counts, and at least one")
    stack = np.stack([np.asarray(z, dtype=np.float64) for z in logits])  # (devices, N, classes)
    if stack.ndim != 3 or stack.shape[2] != np.shape(counts)[1]:
        raise ValueError(f"logits of shape {stack.shape[1:]} do not match {np.shape(counts)[1]} classes")
    weights = capped_importance(counts, max_share)  # (devices, classes)
    if clip_factor is not None:
        scales = screen_scales(stack, clip_factor)
        if (scales < 1.0).any():
            stack = stack * scales[:, None, None]
            weights = weights * scales[:, None]  # a clipped device also weighs less, as in aggregate/robust.py
            weights = weights / np.where(weights.sum(axis=0) > 0, weights.sum(axis=0), 1.0)
    if rule == "median":
        return _weighted_median(stack - stack.mean(axis=2, keepdims=True), weights).astype(np.float32)
    return np.einsum("tnc,tc->nc", stack, weights).astype(np.float32)


def _agreement(model: nn.Module, x: torch.Tensor, teacher: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        top = torch.cat([model(x[i:i + 512]).argmax(1) for i in range(0, len(x), 512)])
    return float((top == teacher.argmax(1)).float().mean())


def distill(student: nn.Module, x: np.ndarray, teacher_logits: np.ndarray,
            config: DistillConfig = DistillConfig()) -> DistillResult:
    """Train ``student`` in place to match the teacher's softened outputs on inputs ``x``."""
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    tt = torch.from_numpy(np.ascontiguousarray(teacher_logits, dtype=np.float32))
    if len(xt) == 0 or len(xt) != len(tt) or tt.ndim != 2:
        raise ValueError(f"need N inputs and (N, classes) teacher logits, got {tuple(xt.shape)} and "
                         f"{tuple(tt.shape)}")
    if not torch.isfinite(xt).all() or not torch.isfinite(tt).all():
        raise ValueError("public inputs or teacher logits contain NaN or Inf")
    temp = float(config.temperature)
    target = F.softmax(tt / temp, dim=1)
    started, steps, loss_sum, seen = time.perf_counter(), 0, 0.0, 0
    student.eval()
    network, xt = trained_part(student, xt, 512)  # MiniRocket's features once, not every epoch
    optimizer = torch.optim.Adam(network.parameters(), lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed)
    network.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for _ in range(config.epochs):
            loss_sum, seen = 0.0, 0
            for idx in torch.randperm(len(xt), generator=gen).split(config.batch_size):
                log_p = F.log_softmax(network(xt[idx]) / temp, dim=1)
                loss = F.kl_div(log_p, target[idx], reduction="batchmean") * temp * temp
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"distillation loss became {float(loss)} at step {steps + 1}")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                steps += 1
                loss_sum += float(loss.detach()) * len(idx)
                seen += len(idx)
    agreement = _agreement(network, xt, tt)
    return DistillResult(loss_sum / max(seen, 1), steps, time.perf_counter() - started, agreement)
