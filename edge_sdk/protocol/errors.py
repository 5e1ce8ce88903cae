"""The single exception type raised for any malformed protocol input, and the codes an
``error`` message carries."""

from __future__ import annotations

from enum import Enum

__all__ = ["ProtocolError", "ERROR_CODES", "ErrorCode"]


class ErrorCode(str, Enum):
    """Every code an ``error`` body carries (docs/protocol.md §7). A ``str`` enum: a member is
    the very string on the wire (``ErrorCode.NOT_TRAINING == "not_training"``), its ``str()`` and
    format are that string, and a decoded `Error` keeps a plain ``str`` code (a newer peer may
    send a code this side does not know)."""

    # protocol codes (`ProtocolError.code`): input that could not be decoded or is out of bounds
    MALFORMED = "malformed"
    OVERSIZE = "oversize"
    DTYPE = "dtype"
    SHAPE = "shape"
    NONFINITE = "nonfinite"  # also an update's NaN/Inf tensor or metric
    VERSION = "version"
    KIND = "kind"
    CHECKSUM = "checksum"
    LIMIT = "limit"
    # the coordinator, refusing a device's input (an update is never aggregated)
    WRONG_LABEL = "wrong_label"
    BAD_SAMPLES = "bad_samples"
    BAD_TENSORS = "bad_tensors"
    BAD_SHAPE = "bad_shape"
    BAD_DTYPE = "bad_dtype"
    WRONG_ROUND = "wrong_round"
    NOT_PARTICIPANT = "not_participant"
    DUPLICATE = "duplicate"
    SENDER_MISMATCH = "sender_mismatch"
    UNKNOWN_DEVICE = "unknown_device"
    BAD_PROFILE = "bad_profile"
    FLOOD = "flood"
    RESEND_BUDGET = "resend_budget"
    UNEXPECTED = "unexpected"
    RATE_LIMITED = "rate_limited"
    UNSUPPORTED_METHOD = "unsupported_method"
    TASK_MISMATCH = "task_mismatch"  # at registration: the device's data is not of the job's task
    # a method's own checks of an update (coordinator/strategies)
    NOT_PLANNED = "not_planned"  # no plan was sent to this device
    NOT_ASKED = "not_asked"  # no plan of this method or stage was sent to this device
    BAD_COUNTS = "bad_counts"  # REFT: class counts negative or not summing to num_samples
    BAD_SCALE = "bad_scale"  # REFT: an int8 logit scale <= 0
    # either side: a chunked message stalled or was evicted
    INCOMPLETE = "incomplete"
    # a device, about a plan (reply_to = the plan) or a published model
    NOT_TRAINING = "not_training"
    TRAIN_FAILED = "train_failed"
    BAD_MODEL = "bad_model"
    NO_DATA = "no_data"  # its data source is missing or empty: it stays in the fleet, training nothing
    UNKNOWN_FIXED = "unknown_fixed"  # the plan left out a fixed tensor it does not hold: the full plan again
    # the coordinator, refusing a device's evaluation report
    BAD_EVALUATION = "bad_evaluation"

    def __str__(self) -> str:  # the wire string, on Python 3.10 to 3.12+ alike (as `enum.StrEnum`)
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


#: The codes carried by :class:`ProtocolError` (see docs/protocol.md).
ERROR_CODES: frozenset[str] = frozenset(
    {"malformed", "oversize", "dtype", "shape", "nonfinite", "version", "kind", "checksum", "limit"}
)


class ProtocolError(ValueError):
    """Malformed, oversize or otherwise unacceptable protocol input.

    ``code`` is one of :data:`ERROR_CODES`; ``str(e)`` is a human-readable explanation.
    """

    def __init__(self, code: str, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown ProtocolError code {code!r}")
        code = str(code)  # an ErrorCode member: its plain string
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message

    def __reduce__(self):  # keep copy/multiprocessing working with the 2-arg constructor
        return (type(self), (self.code, self.message))
