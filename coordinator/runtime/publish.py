"""Publish the trained models: each device gets the dense ONNX network of its own label.

After the last round the coordinator asks the strategy for the inference network of
every label an online device holds (:meth:`Strategy.inference_model`: pre-composed,
pruned or sliced to what that device can run), exports it once per label to ONNX,
checks onnxruntime against torch, and sends it to those devices as a `Model` message
(chunked like any large payload), signed for that device and job with the coordinator's
key when the fleet has one (`attach_signer`; edge_sdk/signing.py). The device verifies the
signature and the SHA-256 and installs it at ``<state_dir>/model.onnx`` for `edgefl predict`;
the coordinator waits (up to a timeout) for every online device's acknowledgement before it
says goodbye.

With ``retain`` (the default) each model is a *retained* message on the device's downlink:
the broker keeps it, so a registered device that is offline when the job ends installs it
when it next connects, with no coordinator running (it skips a model it already has). The
broker holds one model per device until the next job on that topic replaces it; a model
larger than one frame (the link's chunk size, 1 MiB by default) cannot be retained and reaches
online devices only.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Callable, Sequence

import numpy as np

from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.protocol.messages import Envelope, Model
from edge_sdk.signing import ModelSigner

from coordinator.runtime.fleet import COORDINATOR_ID, Fleet

__all__ = ["PublishedModel", "publish_models", "attach_signer", "allowed_onnx_diff"]

log = logging.getLogger(__name__)

#: Largest allowed difference between onnxruntime's and torch's outputs of a published model,
#: relative to the largest output when that exceeds 1 (float32 rounding grows with the logits:
#: a model with logits near 100 differs by ~5e-3 between the two runtimes).
MAX_ONNX_DIFF = 1e-3
#: The same for a model on MiniRocket's features (PPV: the share of a convolution's outputs above a
#: bias): an output that ties a bias within float rounding counts in one runtime and not in the other,
#: moving that feature by 1/L and an output by |weight|/L. The biases and the check's inputs are fixed for
#: a job, so a tie stays: at L = 500 a head weight above 0.5 then fails 1e-3 every round (FedPara's folded
#: head reaches 1.6 on PLAID). Ties are rare with fitted biases (64 PLAID test series: 2e-6) and were
#: common with unfitted zero ones (2 of 160,000 features of 16 series, 0.0027). An export error differs by far more.
MAX_PPV_DIFF = 1e-2


def allowed_onnx_diff(model: Any) -> float:
    """`MAX_PPV_DIFF` for a model with fixed PPV features (a MiniRocket layer), else `MAX_ONNX_DIFF`."""
    return MAX_PPV_DIFF if any(getattr(m, "FIXED_FEATURES", False) for m in model.modules()) else MAX_ONNX_DIFF


@dataclass(frozen=True)
class PublishedModel:
    """One label's published network."""

    label: str
    nbytes: int
    max_abs_diff: float  # onnxruntime vs torch, relative to the largest output when that exceeds 1
    devices: tuple[str, ...]
    acknowledged: tuple[str, ...]
    #: registered devices that were offline: the broker keeps the model for their next connect
    left_for: tuple[str, ...] = ()


def _onnx_bytes(model, input_shape: tuple[int, ...], inputs: np.ndarray | None,
                preprocessing: Preprocessing | None = None) -> tuple[bytes, float]:
    from coordinator.runtime.export import export_onnx

    if inputs is None:
        inputs = np.random.default_rng(0).normal(size=(4, *input_shape)).astype(np.float32)
    if preprocessing is not None and preprocessing.input_shape != input_shape:
        preprocessing = replace(preprocessing, input_shape=input_shape)
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        diff = export_onnx(model, path, inputs[:16], preprocessing=preprocessing)
        return path.read_bytes(), diff / max(1.0, _largest_output(model, inputs[:16]))


def _largest_output(model, inputs: np.ndarray) -> float:
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float(model(torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))).abs().max())
    finally:
        model.train(was_training)


def attach_signer(fleet: Fleet, signer: ModelSigner) -> None:
    """Sign every model published to ``fleet`` with ``signer`` (the round loop calls
    `publish_models` with the fleet it runs on, so the key travels with the fleet)."""
    fleet.model_signer = signer


def _send(fleet: Fleet, device_id: str, message: Model, rnd: int, retain: bool) -> tuple[str, str | None]:
    """Send ``message`` to one device, retained when asked and possible; returns the envelope's
    ``msg_id`` (what the device's ack answers) and why it could not be retained (None when it
    was, or was not asked to be)."""
    env = Envelope.of(message, COORDINATOR_ID, round=rnd)
    why = None
    if retain:
        try:
            fleet.send_envelope(device_id, env, retain=True)
            return env.msg_id, None
        except ValueError as exc:  # raised before anything is sent: the same envelope goes unretained
            why = str(exc)
    if fleet.devices[device_id].online:
        fleet.send_envelope(device_id, env)
    return env.msg_id, why


def publish_models(inference_model: Callable[[str], Any], fleet: Fleet, rnd: int, wait_s: float = 60.0,
                   retain: bool = True, signer: ModelSigner | None = None, *,
                   preprocessing: Preprocessing | None = None,
                   inputs: np.ndarray | None = None, only: Sequence[str] | None = None,
                   keep: Callable[[str, bytes], None] | None = None, version: int = 0) -> list[PublishedModel]:
    """Send every registered device the ONNX network of its label (``inference_model(label)``, a
    method's :meth:`Strategy.inference_model`; None: nothing for that label), offline ones only
    when ``retain``, signed by ``signer`` (default: the fleet's, `attach_signer`; none: unsigned);
    the graph starts with ``preprocessing``'s normalisation, and onnxruntime is checked against
    torch on ``inputs`` (default: random ones); ``only``: to these devices alone (None: every one);
    ``keep(label, onnx_bytes)`` is told each model that goes out (the kept versions); ``version``: the
    model version it is (predictions name it).
    Returns what was sent to whom."""
    signer = signer if signer is not None else fleet.model_signer
    issued_ms = time.time_ns() // 1_000_000
    try:
        import onnx  # noqa: F401  (the exporter needs it)
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        log.warning("not publishing models: %s (install edgefl[coordinator])", exc)
        return []
    by_label: dict[str, list[str]] = {}
    # ``only``: those alone, not a pass over every device (100,000 simulated devices: 0.3 s)
    candidates = sorted(fleet.devices) if only is None else sorted(d for d in set(only) if d in fleet.devices)
    for device_id in candidates:
        record = fleet.devices[device_id]
        if record.label is not None and (record.online or retain):
            by_label.setdefault(record.label, []).append(device_id)
    sent: dict[str, tuple[int, float, list[str]]] = {}
    left_for: list[str] = []
    #: per device, the msg_id of the model message sent to it: its ack's reply_to says it installed it
    model_ids: dict[str, str] = {}
    for label, devices in sorted(by_label.items()):
        model = inference_model(label)
        if model is None:
            continue
        input_shape = tuple(int(n) for n in model.input_shape)
        data, diff = _onnx_bytes(model, input_shape, inputs, preprocessing)
        if not diff <= allowed_onnx_diff(model):
            log.error("not publishing %s: onnxruntime differs from torch by %.3g (relative to the largest "
                      "output)", label, diff)
            continue
        if keep is not None:
            keep(label, data)
        message = Model(label=label, round=rnd, sha256=hashlib.sha256(data).digest(), data=data,
                        input_shape=input_shape, version=version)
        reached, unretained, reason = [], [], ""
        signed_for = {} if signer is None else signer.sign_each(message, fleet.topics.job, devices, issued_ms)
        for device_id in devices:
            signed = signed_for.get(device_id, message)
            model_ids[device_id], why = _send(fleet, device_id, signed, rnd, retain)
            if why is not None:
                unretained.append(device_id)
                reason = why
            if fleet.devices[device_id].online:
                reached.append(device_id)
            elif retain and why is None:
                left_for.append(device_id)
        if unretained:  # one line per label, not one per device; a warning only if someone misses it
            missed = [d for d in unretained if not fleet.devices[d].online]
            log.log(logging.WARNING if missed else logging.INFO,
                    "the %s model is not retained for %s (offline now: %s): %s", label,
                    ", ".join(unretained), ", ".join(missed) or "none", reason)
        sent[label] = (len(data), diff, reached)
        log.info("published the %s model (%d bytes, onnxruntime vs torch %.1e) to %d online devices, "
                 "retained=%s, %s", label, len(data), diff, len(reached), retain,
                 f"signed with key {signer.key_id}" if signer is not None else "unsigned")

    def installed(device_id: str) -> bool:  # it answered that model message with an ack (whatever its note)
        return fleet.devices[device_id].acknowledged(model_ids[device_id])

    waiting = {d for _, _, devices in sent.values() for d in devices}
    end = time.monotonic() + wait_s
    while waiting and time.monotonic() < end:
        fleet.pump(0.1)
        waiting = {d for d in waiting if fleet.devices[d].online and not installed(d)}
    acked = {d for _, _, devices in sent.values() for d in devices if installed(d)}
    if waiting:
        log.warning("no acknowledgement of the published model from %s", sorted(waiting))
    if left_for:
        log.info("the broker keeps the models of offline devices %s for their next connect", left_for)
    return [PublishedModel(label, n, diff, tuple(devices), tuple(sorted(set(devices) & acked)),
                           tuple(d for d in left_for if fleet.devices[d].label == label))
            for label, (n, diff, devices) in sent.items()]
