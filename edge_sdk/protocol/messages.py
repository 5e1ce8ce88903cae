"""Message kinds, the envelope and their strict (de)serialisation (see docs/protocol.md).

An envelope is one frame (codec.py): tensors and chunk slices travel in its data region.
Bodies are maps keyed by field name. Decoding checks every field's type; a missing required
field or a wrong type raises ``ProtocolError("malformed")``; fields that have a default may
be absent; unknown extra fields are ignored (forward compatibility).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import msgpack
import numpy as np

from edge_sdk.data.preprocessing import Preprocessing

from .codec import Blob, CodecLimits, DataRegion, decode_frame, encode_frame, pack_tensors, unpack_tensors
from .errors import ErrorCode, ProtocolError
from .ids import new_id
from .topics import is_valid_id

__all__ = [
    "SCHEMA_VERSION", "MAX_ID_LEN", "MAX_PLAIN_DEPTH", "MAX_SIGNATURE_LEN", "MAX_FIXED",
    "Register", "Plan", "RoundStart", "Update", "Ack", "Error", "Status", "Stop", "Chunk",
    "Model", "ProfileUpdate", "Evaluate", "Evaluation", "DataCount", "StatsRequest", "FleetStats", "STATS_KINDS",
    "SERIES_PARAMS",
    "MAX_EVAL_CLASSES", "Message", "MESSAGE_TYPES",
    "Envelope",
    "encode_envelope", "decode_envelope",
    "peek_header",
]

SCHEMA_VERSION = 1
MAX_EVAL_CLASSES = 100_000  # per-class counts an evaluation may carry
MAX_ID_LEN = 64  # msg_id, reply_to, transfer_id
MAX_CAPABILITIES = 64  # names in a register's capabilities, each at most MAX_ID_LEN characters
MAX_PLAIN_DEPTH = 16  # nesting of model_spec / train
MAX_SIGNATURE_LEN = 1024  # a model's signature (Ed25519: 64 bytes)
MAX_FIXED = 64  # names in a plan's or an update's ``fixed`` map (fixed tensors, by their SHA-256)
MAX_FIXED_NAME = 256  # characters of a fixed tensor's name
_MISSING = object()
_INT64 = (-(1 << 63), (1 << 63) - 1)


# --------------------------------------------------------------------------- field checks


def _bad(msg: str) -> ProtocolError:
    return ProtocolError("malformed", msg)


def _get(body: dict, name: str, default: Any) -> Any:
    value = body.get(name, default)
    if value is _MISSING:
        raise _bad(f"missing field {name!r}")
    return value


def _str(body: dict, name: str, default: Any = _MISSING, max_len: int | None = None) -> str:
    v = _get(body, name, default)
    if not isinstance(v, str):
        raise _bad(f"field {name!r} must be a string")
    if max_len is not None and len(v) > max_len:
        raise _bad(f"field {name!r} longer than {max_len}")
    return v


def _int(body: dict, name: str, default: Any = _MISSING, lo: int = _INT64[0], hi: int = _INT64[1]) -> int:
    v = _get(body, name, default)
    if type(v) is not int:
        raise _bad(f"field {name!r} must be an integer")
    if not lo <= v <= hi:
        raise _bad(f"field {name!r}={v} out of range [{lo}, {hi}]")
    return v


def _float(body: dict, name: str, default: Any = _MISSING, lo: float = -math.inf, hi: float = math.inf) -> float:
    v = _get(body, name, default)
    if type(v) not in (int, float) or not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(f"field {name!r} must be a finite number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _bool(body: dict, name: str, default: Any = _MISSING) -> bool:
    v = _get(body, name, default)
    if type(v) is not bool:
        raise _bad(f"field {name!r} must be a boolean")
    return v


def _str_tuple(body: dict, name: str, default: Any = _MISSING, *, max_items: int | None = None,
               max_len: int | None = None) -> tuple[str, ...]:
    v = _get(body, name, default)
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise _bad(f"field {name!r} must be an array of strings")
    if (max_items is not None and len(v) > max_items) or (max_len is not None and any(len(x) > max_len for x in v)):
        raise _bad(f"field {name!r} must hold at most {max_items} strings of at most {max_len} characters")
    return tuple(v)


def _int_tuple(body: dict, name: str) -> tuple[int, ...]:
    """An optional array of at most MAX_EVAL_CLASSES integers >= 0 (default empty)."""
    v = _get(body, name, ())
    if not isinstance(v, (list, tuple)) or len(v) > MAX_EVAL_CLASSES or not all(
            type(x) is int and 0 <= x <= 1 << 40 for x in v):
        raise _bad(f"field {name!r} must be an array of at most {MAX_EVAL_CLASSES} integers >= 0")
    return tuple(v)


def _shape(body: dict, name: str, default: Any = _MISSING) -> tuple[int, ...]:
    """An array of at most 8 integers in 1 … 2³⁰ (an input shape without the batch axis)."""
    v = _get(body, name, default)
    if not isinstance(v, (list, tuple)) or len(v) > 8 or not all(type(x) is int and 1 <= x <= 2 ** 30 for x in v):
        raise _bad(f"field {name!r} must be an array of at most 8 integers in 1..2^30")
    return tuple(v)


def _map(body: dict, name: str, default: Any, types: tuple[type, ...]) -> dict:
    v = _get(body, name, default)
    if not isinstance(v, dict) or not all(isinstance(k, str) and type(x) in types for k, x in v.items()):
        raise _bad(f"field {name!r} must be a map of string -> {'/'.join(t.__name__ for t in types)}")
    return dict(v)


def _digests(body: dict, name: str) -> dict[str, str]:
    """An optional map of at most MAX_FIXED tensor names to SHA-256 hex digests (default empty)."""
    v = _get(body, name, {})
    if not isinstance(v, dict) or len(v) > MAX_FIXED or not all(
            isinstance(k, str) and 0 < len(k) <= MAX_FIXED_NAME and isinstance(d, str) and len(d) == 64
            and all(c in "0123456789abcdef" for c in d) for k, d in v.items()):
        raise _bad(f"field {name!r} must map at most {MAX_FIXED} tensor names to SHA-256 hex digests")
    return dict(v)


def _metrics(body: dict, name: str, default: Any = _MISSING) -> dict[str, float]:
    return {k: float(v) for k, v in _map(body, name, default, (int, float)).items()}


def _check_plain(v: Any, name: str, depth: int = 0) -> None:
    if depth > MAX_PLAIN_DEPTH:
        raise ProtocolError("limit", f"field {name!r} nested deeper than {MAX_PLAIN_DEPTH}")
    if v is None or type(v) in (bool, int, float, str):
        return
    if isinstance(v, list):
        for x in v:
            _check_plain(x, name, depth + 1)
    elif isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise _bad(f"field {name!r} has a non-string map key")
            _check_plain(x, name, depth + 1)
    else:
        raise _bad(f"field {name!r} holds unsupported type {type(v).__name__}")


def _plain_map(body: dict, name: str) -> dict[str, Any]:
    v = _map(body, name, _MISSING, (type(None), bool, int, float, str, list, dict))
    _check_plain(v, name)
    return v


# --------------------------------------------------------------------------- kinds


class Message:
    """Base of message bodies; ``to_body`` may hold :class:`Blob` values, ``from_body`` reads them from ``data``."""

    KIND: ClassVar[str] = ""

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        raise NotImplementedError

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Message:
        raise NotImplementedError


@dataclass(frozen=True)
class Register(Message):
    """Device -> coordinator: hardware profile and data size."""

    KIND: ClassVar[str] = "register"
    profile: dict[str, Any]
    num_samples: int
    capabilities: tuple[str, ...] = ()
    sdk_version: str = ""
    connection: int = 0  # the MQTT connection it registers over (see `Status.connection`)
    #: the shape of one input of its data (no batch axis) and its number of classes — what its data
    #: is, never the data; ``()`` and 0: not said (an SDK before 0.3)
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"profile": dict(self.profile), "num_samples": self.num_samples,
                "capabilities": list(self.capabilities), "sdk_version": self.sdk_version,
                "connection": self.connection, "input_shape": list(self.input_shape),
                "num_classes": self.num_classes}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Register:
        return cls(_map(body, "profile", _MISSING, (int, float, str, bool)),
                   _int(body, "num_samples", lo=0),
                   _str_tuple(body, "capabilities", (), max_items=MAX_CAPABILITIES, max_len=MAX_ID_LEN),
                   _str(body, "sdk_version", ""), _int(body, "connection", 0, lo=0),
                   _shape(body, "input_shape", ()), _int(body, "num_classes", 0, lo=0, hi=1_000_000))


@dataclass(frozen=True, eq=False)
class Plan(Message):
    """Coordinator -> device: what model to build, its initial weights and how to train."""

    KIND: ClassVar[str] = "plan"
    method: str
    label: str
    model_spec: dict[str, Any]
    tensors: dict[str, np.ndarray]
    train: dict[str, Any]
    #: the job's input normalisation (edge_sdk/data/preprocessing.py `Preprocessing.to_dict`): the device
    #: normalises its raw data with it; None: the device keeps its own (a coordinator before it)
    preprocessing: dict[str, Any] | None = None
    #: the plan's fixed tensors (a MiniRocket layer's biases: the same in every round of a job), by name:
    #: their SHA-256 (`edge_sdk.protocol.fixed_tensors`). One absent from ``tensors`` is one the device
    #: said it holds: it takes it from its cache (edge_sdk/device/fixed_cache.py)
    fixed: dict[str, str] = field(default_factory=dict)

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        body = {"method": self.method, "label": self.label, "model_spec": self.model_spec,
                "tensors": pack_tensors(self.tensors, transfer_dtype), "train": self.train}
        if self.preprocessing is not None:
            body["preprocessing"] = self.preprocessing
        if self.fixed:
            body["fixed"] = dict(self.fixed)
        return body

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Plan:
        prep = _get(body, "preprocessing", None)
        if prep is not None:
            try:
                prep = Preprocessing.from_dict(prep).to_dict()
            except ValueError as exc:
                raise _bad(str(exc)[:200]) from None
        return cls(_str(body, "method"), _str(body, "label"), _plain_map(body, "model_spec"),
                   unpack_tensors(_get(body, "tensors", _MISSING), data, limits), _plain_map(body, "train"),
                   prep, _digests(body, "fixed"))


@dataclass(frozen=True)
class RoundStart(Message):
    """Coordinator -> all: a round begins; updates are due within ``deadline_s`` seconds."""

    KIND: ClassVar[str] = "round_start"
    deadline_s: float
    participants: tuple[str, ...]

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"deadline_s": float(self.deadline_s), "participants": list(self.participants)}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> RoundStart:
        deadline = _get(body, "deadline_s", _MISSING)
        if type(deadline) not in (int, float) or not (math.isfinite(deadline) and deadline >= 0):
            raise _bad(f"deadline_s must be a finite number >= 0, got {deadline!r}")
        return cls(float(deadline), _str_tuple(body, "participants"))


@dataclass(frozen=True, eq=False)
class Update(Message):
    """Device -> coordinator: trained tensors for ``label``."""

    KIND: ClassVar[str] = "update"
    label: str
    tensors: dict[str, np.ndarray]
    num_samples: int
    metrics: dict[str, float]
    #: the plan's fixed tensors it sent back unchanged and left out, by name: the plan's digest of each
    #: (the coordinator restores them from the plan; the device holds them for the next plan)
    fixed: dict[str, str] = field(default_factory=dict)

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        body = {"label": self.label, "tensors": pack_tensors(self.tensors, transfer_dtype),
                "num_samples": self.num_samples, "metrics": dict(self.metrics)}
        if self.fixed:
            body["fixed"] = dict(self.fixed)
        return body

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Update:
        return cls(_str(body, "label"), unpack_tensors(_get(body, "tensors", _MISSING), data, limits),
                   _int(body, "num_samples", lo=0), _metrics(body, "metrics"), _digests(body, "fixed"))


@dataclass(frozen=True)
class Ack(Message):
    KIND: ClassVar[str] = "ack"
    note: str = ""

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"note": self.note}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Ack:
        return cls(_str(body, "note", ""))


@dataclass(frozen=True)
class Error(Message):
    """Either side: the message ``reply_to`` was rejected, or a device will not or could not
    train a plan; ``code`` is an `ErrorCode` (decoded: a plain ``str``, which compares equal to
    one; a code this side does not know is kept as it came)."""

    KIND: ClassVar[str] = "error"
    code: str
    message: str

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        code = self.code.value if isinstance(self.code, ErrorCode) else self.code  # the same bytes either way
        return {"code": code, "message": self.message}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Error:
        return cls(_str(body, "code"), _str(body, "message"))


@dataclass(frozen=True)
class Status(Message):
    """Device state: heartbeat / online / offline / why it is not training."""

    KIND: ClassVar[str] = "status"
    state: str
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    #: the stamp of the sender's MQTT connection this status is about (`MqttTransport.connection_stamp`;
    #: 0: unknown): a last will whose connection is older than one already heard from is stale
    connection: int = 0

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"state": self.state, "reason": self.reason, "metrics": dict(self.metrics),
                "connection": self.connection}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Status:
        return cls(_str(body, "state"), _str(body, "reason", ""), _metrics(body, "metrics", {}),
                   _int(body, "connection", 0, lo=0))


@dataclass(frozen=True)
class Stop(Message):
    KIND: ClassVar[str] = "stop"
    reason: str = ""

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"reason": self.reason}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Stop:
        return cls(_str(body, "reason", ""))


@dataclass(frozen=True)
class Chunk(Message):
    """One slice of a larger encoded envelope (chunking.py); decoded ``data`` is a view onto the frame."""

    KIND: ClassVar[str] = "chunk"
    transfer_id: str
    index: int
    count: int
    total_bytes: int
    sha256: bytes
    data: bytes

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"transfer_id": self.transfer_id, "index": self.index, "count": self.count,
                "total_bytes": self.total_bytes, "sha256": self.sha256, "data": Blob(self.data)}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Chunk:
        tid = _str(body, "transfer_id", max_len=MAX_ID_LEN)
        count = _int(body, "count", lo=1)
        index = _int(body, "index", lo=0, hi=count - 1)
        total = _int(body, "total_bytes", lo=0)
        sha = _get(body, "sha256", _MISSING)
        if not tid:
            raise _bad("transfer_id must not be empty")
        if not isinstance(sha, bytes) or len(sha) != 32:
            raise _bad("sha256 must be 32 bytes of bin")
        chunk = data.take(_get(body, "data", _MISSING), "chunk data")
        if chunk.nbytes > total:
            raise _bad("chunk data is longer than total_bytes")
        return cls(tid, index, count, total, sha, chunk)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Model(Message):
    """Coordinator -> device: the inference model for the device's label, pre-composed to a
    dense network and serialised as ONNX (protobuf data, run by onnxruntime; never pickle)."""

    KIND: ClassVar[str] = "model"
    label: str
    round: int  # the last training round it includes
    sha256: bytes  # of ``data``
    data: bytes  # the ONNX file
    input_shape: tuple[int, ...]  # one sample, without the batch axis
    format: str = "onnx"
    #: when the coordinator signed it (ms since the epoch; 0: unsigned); a device refuses older than its own
    issued_ms: int = 0
    key_id: str = ""  # which coordinator key signed it (edge_sdk/signing.py); "" unsigned
    signature: bytes = b""  # Ed25519 over the manifest of edge_sdk/signing.py; b"" unsigned
    #: the coordinator's model version (docs/continuous.md; 0: not said) — what predictions name;
    #: informational, not in the signed manifest
    version: int = 0

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        body = {"label": self.label, "round": self.round, "format": self.format, "sha256": self.sha256,
                "input_shape": list(self.input_shape), "data": Blob(self.data), "issued_ms": self.issued_ms,
                "key_id": self.key_id, "signature": self.signature}
        if self.version:
            body["version"] = self.version
        return body

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Model:
        label, rnd, fmt = _str(body, "label", max_len=64), _int(body, "round", lo=-1), _str(body, "format")
        if fmt != "onnx":
            raise _bad(f"unknown model format {fmt[:32]!r}")
        sha = _get(body, "sha256", _MISSING)
        if not isinstance(sha, bytes) or len(sha) != 32:
            raise _bad("sha256 must be 32 bytes of bin")
        shape = _get(body, "input_shape", _MISSING)
        if not isinstance(shape, list) or not 1 <= len(shape) <= 3 or not all(
                type(n) is int and 1 <= n <= 65536 for n in shape):
            raise _bad("input_shape must be 1-3 ints in [1, 65536]")
        signature = _get(body, "signature", b"")  # its length is the verifier's to judge (signing.py)
        if not isinstance(signature, bytes) or len(signature) > MAX_SIGNATURE_LEN:
            raise _bad(f"signature must be at most {MAX_SIGNATURE_LEN} bytes of bin")
        return cls(label, rnd, sha, data.take(_get(body, "data", _MISSING), "model data"),  # type: ignore[arg-type]
                   tuple(shape), fmt, _int(body, "issued_ms", 0, lo=0), _str(body, "key_id", "", max_len=MAX_ID_LEN),
                   signature, _int(body, "version", 0, lo=0))


@dataclass(frozen=True)
class ProfileUpdate(Message):
    """Device -> coordinator: it measured its compute again (idle, between rounds) and the figure
    moved; the coordinator sizes its model by it from the next round on. Not a registration: the
    device's sample count and everything else it registered stay as they were."""

    KIND: ClassVar[str] = "profile_update"
    gflops: float  # the new figure, in (0, 1e6]
    trials: int = 0  # timed trials it is the high quantile of (0: not said)
    spread: float = 1.0  # fastest / slowest trial
    median_gflops: float = 0.0  # 0: not said
    load_avg: float = -1.0  # 1-minute load average before measuring; -1: unknown
    others_cpu: float = -1.0  # CPUs' worth of time the rest of the machine used meanwhile; -1: unknown
    cpu_mhz: float = 0.0  # 0: unknown
    busy: bool = False  # the device judged the measurement busy (the coordinator does not take it)
    reason: str = ""  # why it looked busy (<= 300 chars)

    def __post_init__(self) -> None:  # checked (and numbers made floats) as a receiver would
        for name, value in zip(self._FIELDS, self._values(self.to_body()), strict=True):
            object.__setattr__(self, name, value)

    _FIELDS: ClassVar[tuple[str, ...]] = ("gflops", "trials", "spread", "median_gflops", "load_avg", "others_cpu",
                                          "cpu_mhz", "busy", "reason")

    @staticmethod
    def _values(body: dict) -> tuple:
        gflops = _float(body, "gflops", lo=0.0, hi=1e6)
        if gflops <= 0:
            raise _bad("field 'gflops' must be > 0")
        return (gflops, _int(body, "trials", 0, lo=0, hi=100_000), _float(body, "spread", 1.0, lo=1.0, hi=1e6),
                _float(body, "median_gflops", 0.0, lo=0.0, hi=1e6), _float(body, "load_avg", -1.0, lo=-1.0, hi=1e6),
                _float(body, "others_cpu", -1.0, lo=-1.0, hi=4096.0), _float(body, "cpu_mhz", 0.0, lo=0.0, hi=1e6),
                _bool(body, "busy", False), _str(body, "reason", "", max_len=300))

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {name: getattr(self, name) for name in self._FIELDS}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> ProfileUpdate:
        return cls(*cls._values(body))


@dataclass(frozen=True, eq=False)
class Evaluate(Message):
    """Coordinator -> device: evaluate this model — the one the device would be served, as a
    plan carries it — on the device's held-out data, and answer with an `Evaluation`
    (``reply_to`` = this message). ``per_class``: also count per class (they reveal the device's
    label mix, so only when the job asks). ``baseline``: the tensors of the version devices serve
    now (same model spec), to count on the very same samples (only to a device that names the
    capability ``evaluate_baseline``)."""

    KIND: ClassVar[str] = "evaluate"
    method: str
    label: str
    model_spec: dict[str, Any]
    tensors: dict[str, np.ndarray]
    settings: dict[str, Any]  # the method's settings a device needs to build the model (a plan's ``train``)
    preprocessing: dict[str, Any] | None = None
    per_class: bool = False
    baseline: dict[str, np.ndarray] | None = None
    #: as a plan's (`Plan.fixed`): a fixed tensor named here but absent from ``tensors`` is one the
    #: device holds (``baseline`` carries all of its own)
    fixed: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: Plan, per_class: bool = False, baseline: dict[str, np.ndarray] | None = None) -> Evaluate:
        """The evaluation of the model ``plan`` carries (against ``baseline``'s tensors when given)."""
        return cls(plan.method, plan.label, plan.model_spec, plan.tensors, plan.train, plan.preprocessing, per_class,
                   baseline, dict(plan.fixed))

    def as_plan(self) -> Plan:
        """The model to evaluate as a plan (what the device's method parts build models from)."""
        return Plan(self.method, self.label, self.model_spec, self.tensors, self.settings, self.preprocessing,
                    dict(self.fixed))

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        body = self.as_plan().to_body(transfer_dtype)
        body["settings"] = body.pop("train")
        body["per_class"] = self.per_class
        if self.baseline is not None:  # after the plan's tensors: the data region is read in header order
            body["baseline"] = pack_tensors(self.baseline, transfer_dtype)
        return body

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Evaluate:
        plan = Plan.from_body({**body, "train": _get(body, "settings", _MISSING)}, limits, data)
        baseline = unpack_tensors(body["baseline"], data, limits) if "baseline" in body else None
        return cls.of(plan, _bool(body, "per_class", False), baseline)


@dataclass(frozen=True)
class Evaluation(Message):
    """Device -> coordinator: how the model of an `Evaluate` did on the device's held-out data:
    ``num_samples`` evaluated, ``correct`` of them, ``loss_sum`` (summed cross-entropy), and per
    class (``class_counts``/``class_correct``, only when asked). ``num_samples`` 0: no evaluation,
    ``reason`` says why (e.g. too little data). ``baseline_correct``: how many of the same samples
    the `Evaluate`'s ``baseline`` got right (-1: none asked, or it could not be evaluated)."""

    KIND: ClassVar[str] = "evaluation"
    label: str
    num_samples: int
    correct: int
    loss_sum: float
    class_counts: tuple[int, ...] = ()
    class_correct: tuple[int, ...] = ()
    reason: str = ""  # <= 300 characters
    seconds: float = 0.0  # the evaluation's wall-clock on the device
    baseline_correct: int = -1

    def __post_init__(self) -> None:  # checked as a receiver would
        self._check(self.to_body())

    @classmethod
    def _check(cls, body: dict) -> tuple:
        n = _int(body, "num_samples", lo=0, hi=1 << 40)
        correct = _int(body, "correct", lo=0, hi=n)
        loss = _float(body, "loss_sum", lo=0.0)
        counts, right = (_int_tuple(body, name) for name in ("class_counts", "class_correct"))
        if len(counts) != len(right) or sum(counts) != (n if counts else 0) or sum(right) != (correct if right else 0) \
                or any(r > c for r, c in zip(right, counts, strict=True)):
            raise _bad("class_counts/class_correct must be of one length, sum to num_samples/correct, "
                       "and no class may have more correct than samples")
        if n == 0 and (correct or loss):
            raise _bad("an evaluation of no samples has no correct ones and no loss")
        return (_str(body, "label", max_len=MAX_ID_LEN), n, correct, loss, counts, right,
                _str(body, "reason", "", max_len=300), _float(body, "seconds", 0.0, lo=0.0, hi=1e7),
                _int(body, "baseline_correct", -1, lo=-1, hi=n))

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        body = {"label": self.label, "num_samples": self.num_samples, "correct": self.correct,
                "loss_sum": self.loss_sum, "class_counts": list(self.class_counts),
                "class_correct": list(self.class_correct), "reason": self.reason, "seconds": self.seconds}
        if self.baseline_correct >= 0:  # absent otherwise: what an older coordinator reads stays as it was
            body["baseline_correct"] = self.baseline_correct
        return body

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> Evaluation:
        return cls(*cls._check(body))


@dataclass(frozen=True)
class DataCount(Message):
    """Device -> coordinator: how much data it holds now, counted by key — ``training`` samples
    on the training side, ``new`` of them not in the last round it trained (its watermark), and
    ``held_out`` samples. Sent when the counts change (after a re-read of its source), at most
    once per ``[data] reread_s``; a coordinator that paces rounds by new data waits for these."""

    KIND: ClassVar[str] = "data_count"
    training: int
    new: int
    held_out: int = 0

    def __post_init__(self) -> None:  # checked as a receiver would
        self._check(self.to_body())

    @classmethod
    def _check(cls, body: dict) -> tuple:
        training = _int(body, "training", lo=0, hi=1 << 40)
        return training, _int(body, "new", lo=0, hi=training), _int(body, "held_out", 0, lo=0, hi=1 << 40)

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"training": self.training, "new": self.new, "held_out": self.held_out}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> DataCount:
        return cls(*cls._check(body))


#: the fleet statistics a coordinator may ask for (`StatsRequest.kind`): the per-channel moments of
#: the training data, for ``[task] mean = "fleet"``; ``series_histograms``: where a MiniRocket
#: layer's convolution outputs fall and the spread of the series' scales, for its biases
#: (`edge_sdk.models.minirocket_biases`)
STATS_KINDS = ("channel_moments", "series_histograms")
#: the most channels a `FleetStats` carries
MAX_STATS_CHANNELS = 4096
#: what a ``series_histograms`` request names: the MiniRocket layer's feature count, dilations, seed
SERIES_PARAMS = ("features", "max_dilations", "seed")


@dataclass(frozen=True)
class StatsRequest(Message):
    """Coordinator -> device: send `FleetStats` of kind ``kind`` over your training data (asked only
    of a device that names the capability ``fleet_stats``); ``params``: what the kind needs (for
    ``series_histograms``: `SERIES_PARAMS`, small ints)."""

    KIND: ClassVar[str] = "stats_request"
    kind: str
    params: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in STATS_KINDS:
            raise _bad(f"stats kind {self.kind!r} is not one of {STATS_KINDS}")
        wanted = SERIES_PARAMS if self.kind == "series_histograms" else ()
        if set(self.params) != set(wanted) or not all(
                type(v) is int and 0 <= v < 1 << 31 for v in self.params.values()):
            raise _bad(f"stats kind {self.kind!r} takes params {list(wanted)} (ints >= 0), got {sorted(self.params)}")

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        return {"kind": self.kind, **({"params": dict(self.params)} if self.params else {})}

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> StatsRequest:
        params = _get(body, "params", {})
        if not isinstance(params, dict) or len(params) > len(SERIES_PARAMS):
            raise _bad("field 'params' must be a small map")
        return cls(_str(body, "kind", max_len=64), {str(k): v for k, v in params.items()})


@dataclass(frozen=True)
class FleetStats(Message):
    """Device -> coordinator: statistics of its training data of a `StatsRequest`'s ``kind``. For
    ``channel_moments``: ``count`` samples and per channel the ``mean`` and ``m2`` (summed squared
    deviations, per value averaged over a sample's positions), in float64, in the raw value scale.
    For ``series_histograms``: ``tensors`` ``shares`` (per MiniRocket combination, the share of its
    outputs in each bin, each row summing to 1) and ``scales`` (per channel, the share of series
    whose log scale falls in each bin), mean and m2 empty. Aggregates only, never a sample; the
    coordinator weighs ``count`` no more than the samples it believes the device holds."""

    KIND: ClassVar[str] = "fleet_stats"
    kind: str
    count: int
    mean: tuple[float, ...]
    m2: tuple[float, ...]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:  # checked as a receiver would
        self._check(self.to_body())
        self._check_tensors(self.kind, self.tensors)

    @classmethod
    def _check(cls, body: dict) -> tuple:
        kind = _str(body, "kind", max_len=64)
        if kind not in STATS_KINDS:
            raise _bad(f"stats kind {kind!r} is not one of {STATS_KINDS}")
        count = _int(body, "count", lo=0, hi=1 << 40)
        values = []
        for name in ("mean", "m2"):
            v = _get(body, name, _MISSING)
            if not isinstance(v, (list, tuple)) or len(v) > MAX_STATS_CHANNELS or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v):
                raise _bad(f"field {name!r} must be an array of at most {MAX_STATS_CHANNELS} finite numbers")
            values.append(tuple(float(x) for x in v))
        if len(values[0]) != len(values[1]) or any(m < 0 for m in values[1]):
            raise _bad("mean and m2 must be of one length, m2 >= 0")
        return kind, count, values[0], values[1]

    @staticmethod
    def _check_tensors(kind: str, tensors: dict[str, np.ndarray]) -> None:
        wanted = {"shares", "scales"} if kind == "series_histograms" else set()
        if set(tensors) != wanted:
            raise _bad(f"stats kind {kind!r} carries tensors {sorted(wanted)}, got {sorted(tensors)}")
        for name, t in tensors.items():
            if t.ndim != 2 or t.dtype != np.float32 or not np.isfinite(t).all() or (t < 0).any():
                raise _bad(f"tensor {name!r} must be a 2-D float32 array of finite shares >= 0")

    def to_body(self, transfer_dtype: str | None = None) -> dict:
        body = {"kind": self.kind, "count": self.count, "mean": list(self.mean), "m2": list(self.m2)}
        if self.tensors:
            body["tensors"] = pack_tensors(self.tensors)
        return body

    @classmethod
    def from_body(cls, body: dict, limits: CodecLimits, data: DataRegion) -> FleetStats:
        packed = _get(body, "tensors", None)
        tensors = {} if packed is None else unpack_tensors(packed, data, limits)
        return cls(*cls._check(body), tensors)


AnyMessage = Union[Register, Plan, RoundStart, Update, Ack, Error, Status, Stop, Chunk, Model, ProfileUpdate,
                   Evaluate, Evaluation, DataCount, StatsRequest, FleetStats]
MESSAGE_TYPES: dict[str, type[Message]] = {c.KIND: c for c in AnyMessage.__args__}  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- envelope


@dataclass(frozen=True)
class Envelope:
    """Addressing and versioning around one message body."""

    kind: str
    sender: str
    body: AnyMessage
    round: int = -1
    msg_id: str = field(default_factory=new_id)
    reply_to: str | None = None
    version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if getattr(self.body, "KIND", None) != self.kind:
            raise ValueError(f"envelope kind {self.kind!r} does not match body {type(self.body).__name__}")
        if not is_valid_id(self.sender):
            raise ValueError(f"invalid sender {str(self.sender)[:140]!r}: must match [A-Za-z0-9_.-]{{1,128}}")
        if not (isinstance(self.msg_id, str) and 0 < len(self.msg_id) <= MAX_ID_LEN):
            raise ValueError(f"msg_id must be a non-empty str of <= {MAX_ID_LEN} chars")
        if self.reply_to is not None and not (isinstance(self.reply_to, str) and len(self.reply_to) <= MAX_ID_LEN):
            raise ValueError(f"reply_to must be None or a str of <= {MAX_ID_LEN} chars")
        if type(self.round) is not int or not -1 <= self.round <= _INT64[1]:
            raise ValueError(f"round must be an int >= -1, got {self.round!r}")

    @classmethod
    def of(cls, body: AnyMessage, sender: str, round: int = -1, reply_to: str | None = None) -> Envelope:
        """Envelope with ``kind`` taken from ``body.KIND`` and a fresh msg_id."""
        return cls(kind=body.KIND, sender=sender, body=body, round=round, reply_to=reply_to)


def encode_envelope(env: Envelope, transfer_dtype: str | None = None) -> bytes:
    """Serialise ``env`` as one frame; ``transfer_dtype="float16"`` halves float tensors on the wire."""
    return encode_frame({"v": env.version, "kind": env.kind, "id": env.msg_id, "reply_to": env.reply_to,
                         "round": env.round, "sender": env.sender, "body": env.body.to_body(transfer_dtype)})


#: The default limits of `decode_envelope` and `peek_header` (CodecLimits is frozen: one instance serves all).
_DEFAULT_LIMITS = CodecLimits()


def decode_envelope(payload: bytes | memoryview, limits: CodecLimits = _DEFAULT_LIMITS) -> Envelope:
    """Strictly decode an untrusted frame (tensors are read-only views onto it); raises only ProtocolError."""
    obj, data = decode_frame(payload, limits)
    if not isinstance(obj, dict):
        raise _bad("envelope must be a map")
    version = _get(obj, "v", _MISSING)
    if type(version) is not int:
        raise _bad("envelope field 'v' must be an integer")
    if version != SCHEMA_VERSION:
        raise ProtocolError("version", f"unsupported schema version {version} (this side speaks {SCHEMA_VERSION})")
    kind = _str(obj, "kind")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise ProtocolError("kind", f"unknown message kind {kind[:64]!r}")
    body = _get(obj, "body", _MISSING)
    if not isinstance(body, dict):
        raise _bad("envelope body must be a map")
    try:
        msg = cls.from_body(body, limits, data)
        data.finish()
    except ProtocolError as e:
        raise ProtocolError(e.code, f"{kind} body: {e.message}") from None
    try:  # header fields are checked by Envelope.__post_init__
        return Envelope(kind, _get(obj, "sender", _MISSING), msg, _get(obj, "round", _MISSING),  # type: ignore[arg-type]
                        _get(obj, "id", _MISSING), _get(obj, "reply_to", None), version)
    except ValueError as e:
        raise _bad(f"envelope header: {getattr(e, 'message', e)}") from None


def peek_header(payload: object, limits: CodecLimits = _DEFAULT_LIMITS
                ) -> tuple[int | None, str | None, str | None, str | None]:
    """Best-effort ``(version, kind, msg_id, sender)`` of a possibly malformed payload.

    Reads only the envelope's leading header fields (the body is never decoded), so an
    error reply can be addressed even when the body is bad. Never raises.
    """
    found: dict[str, Any] = {}
    try:
        head = memoryview(payload)[:65536]  # type: ignore[arg-type]
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=len(head) or 1,
                                    max_str_len=limits.max_str_len, max_bin_len=len(head),
                                    max_array_len=1024, max_map_len=1024, max_ext_len=0)
        unpacker.feed(head)
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in ("v", "kind", "id", "sender"):
                found[key] = unpacker.unpack()
                if len(found) == 4:
                    break
            else:
                unpacker.skip()
    except Exception:  # best effort: keep whatever was read before the failure
        pass
    v, kind, msg_id, sender = (found.get(k) for k in ("v", "kind", "id", "sender"))
    return (v if type(v) is int else None,
            kind if isinstance(kind, str) and len(kind) <= 64 else None,
            msg_id if isinstance(msg_id, str) and 0 < len(msg_id) <= MAX_ID_LEN else None,
            sender if is_valid_id(sender) else None)
