"""Local training and evaluation loops (classification, cross-entropy).

Training is deterministic for a given ``seed``: batches are shuffled with a
``torch.Generator`` seeded from it and the global torch RNG (dropout) is seeded
inside a forked RNG scope, so callers' random state is left untouched. A fresh
optimizer is created per call (FL local rounds do not carry optimizer state).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.train_config import AUGMENTATIONS, TrainConfig, default_threads

__all__ = ["AUGMENTATIONS", "EvalCounts", "TrainConfig", "TrainResult", "NonFiniteLossError", "TrainingStopped",
           "train_local", "evaluate", "evaluate_counts", "on_device", "proximal_term", "torch_threads",
           "default_threads", "trained_part", "warm_up_optimizer"]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN/inf; the failing step was not applied."""


class TrainingStopped(Exception):
    """Training was asked to stop (the device is shutting down); nothing is uploaded."""


@dataclass(frozen=True)
class TrainResult:
    """``loss`` is the sample-weighted mean cross-entropy over all steps (without
    the regularizer); ``samples`` counts samples processed (with repeats)."""

    loss: float
    steps: int
    samples: int
    seconds: float


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's (process-wide) intra-op thread count is ``n`` for the block (None: left as it is),
    then restored."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _tensors(model: nn.Module, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        raise ValueError("x and y must be numpy arrays")
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need x of shape (N, ...) and y of shape (N,), N >= 1; "
                         f"got {x.shape} and {y.shape}")
    if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu":
        raise ValueError(f"x must be numeric and y integer labels; got {x.dtype}, {y.dtype}")
    expected = getattr(model, "input_shape", None)
    if expected is not None and tuple(x.shape[1:]) != tuple(expected):
        raise ValueError(f"x samples have shape {x.shape[1:]}, model expects {tuple(expected)}")
    xf = np.asarray(x, dtype=np.float32)
    if not (xf.flags.writeable and xf.flags.c_contiguous):  # e.g. read-only wire buffers
        xf = np.array(xf, dtype=np.float32, order="C", copy=True)
    if not np.isfinite(xf).all():
        raise ValueError("x contains NaN or inf")
    if y.min() < 0:
        raise ValueError(f"labels must be >= 0, got {y.min()}")
    return torch.from_numpy(xf), torch.from_numpy(y.astype(np.int64))


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@contextlib.contextmanager
def on_device(model: nn.Module, device: torch.device | str | None) -> Iterator[torch.device]:
    """Move ``model`` (in place) to ``device`` for the block, then back where it was, so that
    what follows (``state_to_numpy``, the wire) finds it on the CPU. ``None``: leave it."""
    home = _device(model)
    target = home if device is None else torch.device(device)
    if target != home:
        model.to(target)
    try:
        yield target
    finally:
        if target != home:
            model.to(home)


def _check_labels(logits: torch.Tensor, y: torch.Tensor) -> None:
    if logits.ndim != 2:
        raise ValueError(f"model must output (N, classes) logits, got shape {tuple(logits.shape)}")
    top = int(y.max())
    if top >= logits.shape[1]:
        raise ValueError(f"label {top} out of range for {logits.shape[1]} classes")


def proximal_term(params: list[torch.Tensor], mu: float) -> Callable[[], torch.Tensor]:
    """``μ/2·‖w − w₀‖²`` over ``params``, ``w₀`` their values now (FedProx, Li et al. 2020)."""
    anchor = [p.detach().clone() for p in params]

    def term() -> torch.Tensor:
        return 0.5 * mu * torch.stack([(p - a).pow(2).sum() for p, a in zip(params, anchor, strict=True)]).sum()

    return term


def warm_up_optimizer() -> None:
    """Create and drop one SGD optimizer: a process's first one imports ``torch._dynamo`` (1.3 s
    here), which a simulation would otherwise pay inside its first round, with every device of it
    waiting. Safe on any thread (the import system locks the modules)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


#: the most values a fixed prefix's features may take to be computed once (256 MB of float32)
MAX_FIXED_FEATURES = 64 << 20


#: spec layer types whose modules have ``FIXED_FEATURES`` (tests/edge_sdk/test_minirocket.py ties them):
#: the simulated device time counts them once per sample (`edge_sdk.methods.base.fixed_flops`)
FIXED_LAYER_TYPES = ("minirocket",)


def fixed_prefix(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(prefix, rest)`` when a spec model starts with layers whose output depends on their input
    alone (``FIXED_FEATURES``: nothing trains, train and eval alike), else None."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.Sequential) or len(layers) < 2:
        return None
    count = 0
    while count < len(layers) - 1 and getattr(layers[count], "FIXED_FEATURES", False):
        count += 1
    return (layers[:count], layers[count:]) if count else None


def fixed_features(prefix: nn.Module, x: torch.Tensor, batch: int) -> torch.Tensor | None:
    """``prefix(x)`` in batches, without gradients; None when they would be too many to keep."""
    with torch.no_grad():
        first = prefix(x[:batch])
        if first[0].numel() * len(x) > MAX_FIXED_FEATURES:
            return None
        return torch.cat([first, *[prefix(x[i:i + batch]) for i in range(batch, len(x), batch)]])


def trained_part(model: nn.Module, x: torch.Tensor, batch: int) -> tuple[nn.Module, torch.Tensor]:
    """``(network, inputs)`` to train on: the layers after a model's fixed prefix (`fixed_prefix`) and its
    features, computed once instead of every epoch (MiniRocket's transform); else ``(model, x)``."""
    split = fixed_prefix(model)
    if split is not None:
        features = fixed_features(split[0], x, batch)
        if features is not None:  # (not too many to keep)
            return split[1], features
    return model, x


def _data_loss(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`TrainConfig.loss` of a batch: cross-entropy, or half the squared distance of the logits to
    ±1 targets summed over the classes (a ridge classifier's), both averaged over the batch."""
    if kind == "squared":
        target = F.one_hot(labels, logits.shape[1]).to(logits.dtype) * 2 - 1
        return 0.5 * ((logits - target) ** 2).sum(dim=1).mean()
    return F.cross_entropy(logits, labels)


def train_local(model: nn.Module, x: np.ndarray, y: np.ndarray, config: TrainConfig,
                seed: int = 0, regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
                on_step: Callable[[int], None] | None = None,
                device: torch.device | str | None = None) -> TrainResult:
    """Train ``model`` in place on ``(x, y)`` with cross-entropy (+ ``regularizer(model)``, + the
    proximal term when ``config.prox_mu`` > 0).

    On ``device`` (e.g. ``cuda``) the model, the data and the optimizer state live there while
    training; the model is moved back where it was afterwards. ``on_step(step)`` is called
    after every optimizer step (1-based); an exception it raises aborts training and
    propagates. The model's train/eval mode is restored afterwards. Raises
    NonFiniteLossError before applying a step whose loss is NaN/inf, ValueError for bad data.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    xt, yt = _tensors(model, x, y)
    if config.augment == "hflip" and xt.ndim != 4:
        raise ValueError(f"augment 'hflip' needs N x C x H x W images, got samples of shape {tuple(xt.shape[1:])}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters")
    if config.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    n, was_training = len(xt), model.training
    gen = torch.Generator().manual_seed(seed)
    steps = samples = 0
    loss_sum = 0.0
    start = time.perf_counter()
    model.train()
    try:
        with (on_device(model, device) as dev, torch_threads(config.threads),
              torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else [])):
            xt, yt = xt.to(dev), yt.to(dev)  # a device's shard is small: copied once, not per batch
            proximal = proximal_term(params, config.prox_mu) if config.prox_mu > 0 else None
            if dev.type == "cpu":  # the CPU's generator alone: torch.manual_seed also queues every
                torch.default_generator.manual_seed(seed)  # accelerator's, with a traceback (~0.1 ms)
            else:
                torch.manual_seed(seed)
            # augmented inputs change every epoch: their features too
            forward, inputs = trained_part(model, xt, config.batch_size) if config.augment == "none" else (model, xt)
            for epoch in range(config.epochs):
                if config.max_steps is not None and steps >= config.max_steps:
                    break
                order = torch.randperm(n, generator=gen)
                for i in range(0, n, config.batch_size):
                    if config.max_steps is not None and steps >= config.max_steps:
                        break
                    idx = order[i:i + config.batch_size].to(dev)
                    xb, yb = inputs[idx], yt[idx]
                    if config.augment == "hflip":
                        flip = (torch.rand(len(idx), generator=gen) < 0.5).to(dev)
                        xb = torch.where(flip[:, None, None, None], xb.flip(-1), xb)
                    logits = forward(xb)
                    if steps == 0:
                        _check_labels(logits, yb)
                    data_loss = _data_loss(config.loss, logits, yb)
                    loss = data_loss + regularizer(model) if regularizer else data_loss
                    if proximal is not None:
                        loss = loss + proximal()
                    if not torch.isfinite(loss):
                        raise NonFiniteLossError(
                            f"non-finite loss {float(loss.detach())} at epoch {epoch + 1}, step "
                            f"{steps + 1} (data loss {float(data_loss.detach())}); lower the lr?")
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    steps += 1
                    samples += len(idx)
                    loss_sum += float(data_loss.detach()) * len(idx)
                    if on_step is not None:
                        on_step(steps)
    finally:
        model.train(was_training)
    return TrainResult(loss=loss_sum / max(samples, 1), steps=steps, samples=samples,
                       seconds=time.perf_counter() - start)


#: Evaluation's batch: on a CPU, batches whose activations outgrow the cache are slower per
#: image (2 AMD EPYC cores, cnn4 on 10,000 images: 1.0 s at 64 or 128, 1.8-2.2 s at 512).
EVAL_BATCH = 128


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = EVAL_BATCH,
             device: torch.device | str | None = None) -> tuple[float, float]:
    """``(accuracy in [0, 1], mean cross-entropy)`` in eval mode without gradients, on
    ``device`` if given (the model is moved back afterwards)."""
    counts = evaluate_counts(model, x, y, batch_size, device)
    return counts.correct / counts.samples, counts.loss_sum / counts.samples


@dataclass(frozen=True)
class EvalCounts:
    """What an evaluation counted: samples, correct ones, summed cross-entropy, and per class
    (``class_counts``/``class_correct``, one entry per output; empty unless asked for)."""

    samples: int
    correct: int
    loss_sum: float
    class_counts: tuple[int, ...] = ()
    class_correct: tuple[int, ...] = ()


def evaluate_counts(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = EVAL_BATCH,
                    device: torch.device | str | None = None, per_class: bool = False) -> EvalCounts:
    """:func:`evaluate`'s sums (and, with ``per_class``, per-class counts), for reports that are
    added up over devices."""
    if type(batch_size) is not int or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    xt, yt = _tensors(model, x, y)
    was_training = model.training
    correct, loss_sum = 0, 0.0
    counts = right = None
    model.eval()
    try:
        with on_device(model, device) as dev, torch.no_grad():
            for i in range(0, len(xt), batch_size):
                xb, yb = xt[i:i + batch_size].to(dev), yt[i:i + batch_size].to(dev)
                logits = model(xb)
                _check_labels(logits, yb)
                loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
                hit = logits.argmax(dim=1) == yb
                correct += int(hit.sum())
                if per_class:
                    k = logits.shape[1]
                    batch_counts = torch.bincount(yb, minlength=k).cpu()
                    batch_right = torch.bincount(yb[hit], minlength=k).cpu()
                    counts = batch_counts if counts is None else counts + batch_counts
                    right = batch_right if right is None else right + batch_right
    finally:
        model.train(was_training)
    if counts is None or right is None:
        return EvalCounts(len(xt), correct, loss_sum)
    return EvalCounts(len(xt), correct, loss_sum, tuple(int(c) for c in counts), tuple(int(c) for c in right))
