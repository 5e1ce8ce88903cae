"""A device's local-training settings (:class:`TrainConfig`), without torch.

They travel in every plan (``plan.train``) and are checked on arrival; the CLI reads their
defaults to build its options, so this module imports neither torch nor numpy
(:mod:`edge_sdk.training` runs them).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

__all__ = ["AUGMENTATIONS", "LOSSES", "TrainConfig", "available_cpus", "default_threads"]

_OPTIMIZERS = ("sgd", "adam")
#: Data augmentation of local training: ``hflip`` mirrors a random half of every batch
#: left-right (images only), as the official FLANC code's RandomHorizontalFlip.
AUGMENTATIONS = ("none", "hflip")
#: The training loss: ``cross_entropy`` on the logits, or ``squared``: half the squared distance of
#: the logits to ±1 targets (+1 for the class, −1 for the others), a ridge classifier's loss, which
#: a linear head on fixed features (MiniRocket's) is fitted with in its paper and in sktime.
LOSSES = ("cross_entropy", "squared")


def _num(name: str, v: Any, lo: float, hi: float, integer: bool = False) -> None:
    ok_type = type(v) is int if integer else (type(v) in (int, float) and math.isfinite(v))
    if not ok_type or not lo <= v <= hi:
        kind = "an int" if integer else "a finite number"
        raise ValueError(f"TrainConfig.{name} must be {kind} in [{lo}, {hi}], got {v!r}")


@dataclass(frozen=True)
class TrainConfig:
    """Local training hyper-parameters (validated; may come from untrusted plans).

    ``max_steps`` caps optimizer steps over all epochs; ``threads`` sets torch's
    (process-global) intra-op thread count for the duration of :func:`train_local` (None: the
    device's own, a client's ``[schedule] threads``). ``momentum`` is ignored by Adam (default betas).

    SGD's defaults, lr 0.05 with momentum 0.5, learned steadily on IID and on 3-class non-IID
    devices over seeds; momentum 0.9 (a step 10× the lr once built up) made a device's loss
    explode now and then and its update drag the average to chance (BENCHMARKS.md, issue 36).
    """

    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.5
    weight_decay: float = 0.0
    max_steps: int | None = None
    optimizer: str = "sgd"
    threads: int | None = None
    augment: str = "none"
    #: FedProx's proximal term μ/2·‖w − w₀‖² over the trainable parameters, w₀ their values when
    #: training starts (the plan's global model); 0: none
    prox_mu: float = 0.0
    loss: str = "cross_entropy"

    def __post_init__(self) -> None:
        _num("epochs", self.epochs, 1, 10_000, integer=True)
        _num("batch_size", self.batch_size, 1, 65_536, integer=True)
        _num("lr", self.lr, 0.0, 10.0)
        if self.lr <= 0:
            raise ValueError("TrainConfig.lr must be > 0")
        _num("momentum", self.momentum, 0.0, 0.999)
        _num("weight_decay", self.weight_decay, 0.0, 1.0)
        if self.max_steps is not None:
            _num("max_steps", self.max_steps, 1, 10_000_000, integer=True)
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer must be one of {_OPTIMIZERS}, "
                             f"got {self.optimizer!r}")
        if self.threads is not None:
            _num("threads", self.threads, 1, 1024, integer=True)
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"TrainConfig.augment must be one of {AUGMENTATIONS}, got {self.augment!r}")
        _num("prox_mu", self.prox_mu, 0.0, 1e4)
        if self.loss not in LOSSES:
            raise ValueError(f"TrainConfig.loss must be one of {LOSSES}, got {self.loss!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain msgpack-safe dict (``loss`` only when not the default: a device of before it
        takes the plan)."""
        data = asdict(self)
        if data["loss"] == "cross_entropy":
            del data["loss"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        """Build from untrusted data: unknown keys and bad types/ranges raise ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(f"TrainConfig data must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = [repr(k)[:40] for k in data if k not in known]
        if unknown:
            raise ValueError(f"TrainConfig: unknown key(s) {', '.join(sorted(unknown))}")
        return cls(**data)


def default_threads() -> int:
    """The torch threads a device trains with unless told otherwise (a client TOML without
    ``[schedule] threads``, ``edgefl simulate`` without ``--threads``): half of the CPUs this
    process may run on, at least 1. On 2 cores, 2 threads were the fastest on an idle machine but
    ran 2-11× slower than 1 thread once other processes kept one or both cores busy (OpenMP threads
    spin, waiting for a descheduled sibling); 1 thread did not slow down while the other core was
    busy and shared fairly when both were (BENCHMARKS.md, issue 36)."""
    return max(1, available_cpus() // 2)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity on Linux, else the machine's), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
