"""REFT on the device: train the pruned model it was sent, then upload logits on the public set.

The plan carries the pruned network as spec data plus its weights, and (the first time a device
takes part) the public unlabeled inputs as ``public.*`` tensors: ``uint8`` with a per-channel
``offset``/``scale`` (or ``float16``). The device keeps them (``ctx.state_dir`` as .npy, and in
memory) under their SHA-256 digest, which every plan names in ``train["public_digest"]``.

The update holds ``logits`` on every public input (``float16``, or ``int8`` with a per-row
``logits.scale``), the per-class sample ``counts`` of the private data, and, only when the plan
asks (``upload_weights``, for evaluating device models), the trained weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
import time
from typing import Mapping

import numpy as np
import torch

from edge_sdk.methods.base import DeviceContext, LocalData, plan_settings, planned_model, round_update
from edge_sdk.methods.settings.reft import LOGITS_DTYPES, PUBLIC_DTYPES, ReftRound, ReftSettings
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.tensors import state_to_numpy
from edge_sdk.training import on_device

__all__ = ["FLOAT16_MAX", "train_reft", "encode_public", "decode_public", "public_digest", "quantize_logits",
           "dequantize_logits", "PUBLIC_PREFIX"]

PUBLIC_PREFIX = "public."
#: the largest magnitude sent as float16 (its largest finite value is 65,504)
FLOAT16_MAX = 65000.0
_KEPT = "reft/public"  # DeviceContext.memory: (digest, public inputs)


# ----------------------------------------------------------------- public set on the wire
def encode_public(x: np.ndarray, dtype: str = "uint8") -> dict[str, np.ndarray]:
    """Public inputs as plan tensors: ``uint8`` with a per-channel affine map, or ``float16``."""
    if dtype not in PUBLIC_DTYPES:
        raise ValueError(f"public dtype must be one of {PUBLIC_DTYPES}, got {dtype!r}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim < 2 or len(x) == 0 or not np.isfinite(x).all():
        raise ValueError(f"public inputs must be a finite (N, ...) array with N >= 1, got {x.shape}")
    if dtype == "float16":
        if np.abs(x).max() > FLOAT16_MAX:
            raise ValueError(f"public inputs reach {np.abs(x).max():.4g}, beyond float16's range: send them as uint8")
        return {f"{PUBLIC_PREFIX}x": x.astype(np.float16)}
    axes = tuple(i for i in range(x.ndim) if i != 1)
    lo, hi = x.min(axis=axes), x.max(axis=axes)
    scale = np.where(hi > lo, (hi - lo) / 255.0, 1.0).astype(np.float32)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    q = np.rint((x - lo.reshape(shape)) / scale.reshape(shape))
    return {f"{PUBLIC_PREFIX}x": np.clip(q, 0, 255).astype(np.uint8),
            f"{PUBLIC_PREFIX}offset": lo.astype(np.float32), f"{PUBLIC_PREFIX}scale": scale}


def decode_public(tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """The float32 public inputs from :func:`encode_public`'s tensors (checked)."""
    x = tensors.get(f"{PUBLIC_PREFIX}x")
    if not isinstance(x, np.ndarray) or x.ndim < 2 or len(x) == 0:
        raise ValueError("public set: missing or malformed 'public.x'")
    if x.dtype == np.float16 or x.dtype == np.float32:
        out = x.astype(np.float32)
    elif x.dtype == np.uint8:
        offset, scale = tensors.get(f"{PUBLIC_PREFIX}offset"), tensors.get(f"{PUBLIC_PREFIX}scale")
        if not all(isinstance(a, np.ndarray) and a.shape == (x.shape[1],) for a in (offset, scale)):
            raise ValueError(f"public set: offset and scale must have shape ({x.shape[1]},)")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        out = (x.astype(np.float32) * scale.astype(np.float32).reshape(shape)
               + offset.astype(np.float32).reshape(shape))
    else:
        raise ValueError(f"public set: unsupported dtype {x.dtype}")
    if not np.isfinite(out).all():
        raise ValueError("public set contains NaN or Inf")
    return out


def public_digest(tensors: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the ``public.*`` tensors' names, dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for name in sorted(k for k in tensors if k.startswith(PUBLIC_PREFIX)):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _public_set(ctx: DeviceContext, tensors: Mapping[str, np.ndarray], digest: str) -> np.ndarray:
    """The public inputs: from the plan (verified, then kept) or from what this device kept."""
    path = ctx.state_dir / f"public-{digest[:32]}.npy" if ctx.state_dir is not None else None
    if tensors:
        if public_digest(tensors) != digest:
            raise ValueError("public set does not match its digest")
        x = decode_public(tensors)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, x, allow_pickle=False)
        if ctx.memory is not None:
            ctx.memory[_KEPT] = (digest, x)
        return x
    kept = (ctx.memory or {}).get(_KEPT)
    if kept is not None and kept[0] == digest:
        return kept[1]
    if path is not None and path.is_file():
        x = np.load(path, allow_pickle=False)
        if x.dtype == np.float32 and x.ndim >= 2 and np.isfinite(x).all():
            return x
    raise ValueError(f"public set {digest[:12]} is not kept on this device; the coordinator must resend it")


# ----------------------------------------------------------------- logits on the wire
def quantize_logits(logits: np.ndarray, dtype: str = "float16") -> dict[str, np.ndarray]:
    """``{"logits": float16}`` or ``{"logits": int8, "logits.scale": float32 per row}``."""
    if dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits dtype must be one of {LOGITS_DTYPES}, got {dtype!r}")
    z = np.asarray(logits, dtype=np.float32)
    if dtype == "float16":
        return {"logits": np.clip(z, -FLOAT16_MAX, FLOAT16_MAX).astype(np.float16)}
    peak = np.abs(z).max(axis=1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(z / scale[:, None]), -127, 127).astype(np.int8)
    return {"logits": q, "logits.scale": scale}


def dequantize_logits(tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """float32 logits from :func:`quantize_logits`'s tensors."""
    z = tensors["logits"]
    if z.dtype == np.int8:
        return z.astype(np.float32) * tensors["logits.scale"].astype(np.float32)[:, None]
    return z.astype(np.float32)


def _logits(model: torch.nn.Module, x: np.ndarray, batch_size: int = 256,
            device: torch.device | None = None) -> np.ndarray:
    was_training = model.training
    model.eval()
    try:
        with on_device(model, device) as dev, torch.no_grad():
            batches = (torch.from_numpy(np.array(x[i:i + batch_size], dtype=np.float32)).to(dev)  # a read-only map too
                       for i in range(0, len(x), batch_size))
            return np.concatenate([model(batch).cpu().numpy() for batch in batches])
    finally:
        model.train(was_training)


# ----------------------------------------------------------------- the device method
def train_reft(plan: Plan, data: LocalData, ctx: DeviceContext) -> Update:
    """Train the pruned model on private data; upload logits on the public set and class counts."""
    config, settings, told = plan_settings(plan, ReftSettings, ReftRound)
    digest = told.public_digest
    if len(digest) != 64:
        raise ValueError("plan lacks a valid public_digest")
    public = {k: v for k, v in plan.tensors.items() if k.startswith(PUBLIC_PREFIX)}
    weights = {k: v for k, v in plan.tensors.items() if not k.startswith(PUBLIC_PREFIX)}
    x_public = _public_set(ctx, public, digest)
    model = planned_model(replace(plan, tensors=weights))
    classes = int(plan.model_spec["num_classes"])
    if data.num_classes != classes:
        raise ValueError(f"local data has {data.num_classes} classes, the model {classes}")
    if tuple(x_public.shape[1:]) != tuple(model.input_shape):
        raise ValueError(f"public inputs have shape {x_public.shape[1:]}, model expects {model.input_shape}")
    result = ctx.train(model, data.x, data.y, config)
    started = time.perf_counter()
    # batches of the training size: no more activation memory than training
    logits = _logits(model, x_public, batch_size=config.batch_size, device=ctx.device)
    logits_seconds = time.perf_counter() - started
    tensors = {"counts": np.bincount(data.y, minlength=classes).astype(np.int64),
               **quantize_logits(logits, settings.logits_dtype)}
    if settings.device_eval:
        tensors.update(state_to_numpy(model, copy=True))
    return round_update(plan, data, ctx, model, result, extra_seconds=logits_seconds, forward=len(x_public),
                        tensors=tensors, public_samples=float(len(x_public)))
