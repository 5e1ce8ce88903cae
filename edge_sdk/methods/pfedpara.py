"""pFedPara on the device: ``W = W1 ⊙ (W2 + 1)``; only ``W1`` travels, ``W2`` never leaves.

The plan carries the shared tensors (``W1`` factors ``x1``/``y1``/``t1``, biases, every
non-factorised layer); the device adds its personal ``W2`` factors (``x2``/``y2``/``t2``
of every ``personal`` FedPara layer, :func:`edge_sdk.models.fedpara.personal_names`),
trains everything, uploads only the shared tensors and keeps ``W2`` for the next round
in ``ctx.state_dir/pfedpara_personal.npz`` (``np.savez``, read back with
``allow_pickle=False``; tied to the spec by a SHA-256 fingerprint, so a different
model starts a fresh ``W2``). Without a state directory ``W2`` is kept in the
client's memory only (``DeviceContext.memory``). A first-time ``W2`` is ``X2 = 0`` (the layer's init), so the
device starts from the shared model.

``plan.train``'s ``holdout`` (fraction in [0, 0.9]; read with pFedPara's settings,
:class:`edge_sdk.methods.settings.fedpara.PFedParaSettings`, default 0.2 as on the coordinator) holds that share
of the local data out of training, each sample's side decided by its key alone (the rule of
``[data] holdout``, edge_sdk/data/holdout.py, with an independent hash), so it never moves as data
grows; the personal model's accuracy on it after local training is reported as the
``local_acc`` metric (``local_n`` samples).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edge_sdk.data.holdout import MIN_HOLDOUT, held_out, sample_keys
from edge_sdk.methods.base import DeviceContext, LocalData, compute_seconds, plan_settings
from edge_sdk.methods.settings.fedpara import PFedParaSettings
from edge_sdk.models.fedpara import personal_names
from edge_sdk.models.spec import build_model
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import evaluate

__all__ = ["train_pfedpara", "personal_model", "personal_split", "spec_fingerprint", "load_personal",
           "save_personal", "PERSONAL_FILE"]

log = logging.getLogger(__name__)
PERSONAL_FILE = "pfedpara_personal.npz"
_FINGERPRINT = "__spec_sha256__"
#: makes pFedPara's split of a key independent of the device's own holdout of the same key
_PERSONAL_SALT = 0x5046656450617261


def spec_fingerprint(spec: dict) -> str:
    """SHA-256 of the spec's canonical JSON."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def personal_split(data: LocalData, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)`` masks of pFedPara's own holdout: a sample's side decided by its key
    alone (independently of the device's ``[data] holdout``), so it never changes as data grows;
    fewer than :data:`MIN_HOLDOUT` held-out samples wait, neither trained on nor evaluated."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not math.isfinite(fraction) or not 0.0 <= fraction <= 0.9:
        raise ValueError(f"pfedpara: holdout must be a number in [0, 0.9], got {fraction!r}")
    if fraction == 0 or len(data) == 0:
        return np.ones(len(data), bool), np.zeros(len(data), bool)
    keys = data.keys if data.keys is not None else sample_keys(data.x, data.y)
    held = held_out(keys, fraction, salt=_PERSONAL_SALT)
    return ~held, held if held.sum() >= MIN_HOLDOUT else np.zeros(len(data), bool)


def load_personal(path: Path, fingerprint: str,
                  shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray] | None:
    """The stored ``W2`` if it exists and fits ``fingerprint`` and ``shapes``; else None."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            found = stored[_FINGERPRINT].tobytes().decode() if _FINGERPRINT in stored.files else ""
            tensors = {k: np.array(stored[k]) for k in stored.files if k != _FINGERPRINT}
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
        log.warning("pfedpara: ignoring unreadable personal state %s: %s", path, exc)
        return None
    if found != fingerprint:
        log.warning("pfedpara: personal state %s belongs to another model; starting afresh", path)
        return None
    if set(tensors) != set(shapes) or any(
            tensors[k].shape != shapes[k] or tensors[k].dtype.kind != "f" or not np.isfinite(tensors[k]).all()
            for k in shapes):
        log.warning("pfedpara: personal state %s does not fit the model; starting afresh", path)
        return None
    return tensors


def save_personal(path: Path, fingerprint: str, tensors: dict[str, np.ndarray]) -> None:
    """Atomically write ``W2`` (and the spec fingerprint) as an ``.npz`` archive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()},
             **{_FINGERPRINT: np.frombuffer(fingerprint.encode(), dtype=np.uint8)})
    os.replace(tmp, path)


@dataclass
class _Personal:
    model: torch.nn.Module
    personal: list[str]
    shared: list[str]
    path: Path | None
    fingerprint: str


def _personal_model(plan: Plan, ctx: DeviceContext) -> _Personal:
    """The plan's shared tensors with this device's own W2 (a first-time one if it has none)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed * 1_000_003 + 17)  # a device's first W2 is its own
        model = build_model(plan.model_spec)
    personal = personal_names(model)
    if not personal:
        raise ValueError("pfedpara: the plan's model has no personal FedPara layers")
    state = state_to_numpy(model)
    shared = [k for k in state if k not in personal]
    if set(plan.tensors) != set(shared):
        extra = sorted(set(plan.tensors) - set(shared))[:5]
        missing = sorted(set(shared) - set(plan.tensors))[:5]
        raise ValueError(f"pfedpara: plan tensors do not match the shared part (extra {extra}, "
                         f"missing {missing})")
    load_numpy_state(model, plan.tensors, strict=False)
    fingerprint = spec_fingerprint(plan.model_spec)
    path = Path(ctx.state_dir) / PERSONAL_FILE if ctx.state_dir is not None else None
    shapes = {k: tuple(state[k].shape) for k in personal}
    stored = load_personal(path, fingerprint, shapes) if path is not None \
        else (ctx.memory or {}).get(f"pfedpara/{fingerprint}")
    if stored is not None:
        load_numpy_state(model, stored, strict=False)
    return _Personal(model, personal, shared, path, fingerprint)


def personal_model(plan: Plan, ctx: DeviceContext) -> torch.nn.Module:
    """The model this device is served: the shared tensors of ``plan`` with its own W2 (what
    federated evaluation evaluates)."""
    return _personal_model(plan, ctx).model


def train_pfedpara(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """One local pFedPara round: train W1 and the device's own W2, upload W1 only."""
    config, settings = plan_settings(plan, PFedParaSettings)
    train_mask, held_mask = personal_split(data, settings.holdout)
    built = _personal_model(plan, ctx)
    model = built.model
    train_idx, held_idx = np.flatnonzero(train_mask), np.flatnonzero(held_mask)
    result = ctx.train(model, data.x[train_idx], data.y[train_idx], config)
    seconds = result.seconds
    metrics = {"loss": result.loss, "steps": float(result.steps)}
    if len(held_idx):
        start = time.perf_counter()
        metrics["local_acc"], metrics["local_loss"] = evaluate(model, data.x[held_idx], data.y[held_idx],
                                                             batch_size=config.batch_size, device=ctx.device)
        metrics["local_n"] = float(len(held_idx))
        seconds += time.perf_counter() - start
    after = state_to_numpy(model, copy=True)
    own = {k: after[k] for k in built.personal}
    if built.path is not None:
        save_personal(built.path, built.fingerprint, own)
    elif ctx.memory is not None:
        ctx.memory[f"pfedpara/{built.fingerprint}"] = own
    compute_s = compute_seconds(ctx, plan.model_spec, seconds, trained=result.samples, forward=len(held_idx))
    metrics.update(train_seconds=seconds, compute_s=compute_s)
    return Update(label=plan.label, tensors={k: after[k] for k in built.shared},
                  num_samples=len(train_idx), metrics=metrics)
