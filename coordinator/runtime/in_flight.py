"""What an asynchronous job on a real fleet holds open between two versions, kept across a stop.

When `edgefl coordinator` stops (Ctrl-C, ``systemctl stop``, an error) in the middle of a version,
its devices still hold the plans it sent them and may have trained them; it also holds updates it
accepted but has not yet stepped a version with. Written beside the checkpoint at the stop and
read back on resume, they are not lost: the plans open then are sent again to their devices under
the same tags and the same tensors, so a device that trained one answers with the update it kept
(`edge_sdk.device.device_rounds.plan_digest`) instead of training again, and the updates taken are
folded into the resumed version as they would have been.

The file belongs to the checkpoint's version: written when the version ``version`` (round
``round``) was being filled, it is read only by a job resuming from that very version, and removed
once read. Pickle-free, in the checkpoint's frame layout (a msgpack header, then the tensors' bytes:
`edge_sdk.protocol.codec`), written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edge_sdk.protocol.codec import decode_frame, encode_frame, pack_tensors, unpack_tensors
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import Plan, Update

from coordinator.core.received_update import ReceivedUpdate
from coordinator.runtime.safe_files import write_bytes_atomically
from coordinator.runtime.state import CHECKPOINT_LIMITS

__all__ = ["IN_FLIGHT_FILE", "InFlightState", "OpenPlanState", "TakenUpdate", "save_in_flight", "load_in_flight"]

IN_FLIGHT_FILE = "in_flight.msgpack"
_FORMAT = 1

Base = tuple[int, str]  # (version, label): the model a plan carried (`AsyncLoop._bases`)


@dataclass(frozen=True)
class OpenPlanState:
    """A plan out at the stop: ``plan`` as sent under ``tag`` (its tensors those of its base)."""

    device: str
    tag: int
    base: Base
    plan: Plan
    age_s: float  # how long it had been out: its deadline counts on from there
    new_samples: int  # the new samples its device held when it was sent (a job paced by data)


@dataclass(frozen=True)
class TakenUpdate:
    """An accepted update not yet in a version: folded into the buffer being filled (``stale``: the
    staleness it was weighed with; its tensors restated on the current version) or held for the
    next buffer (``stale`` None: as it arrived, trained on ``base``)."""

    received: ReceivedUpdate
    base: Base
    stale: int | None


@dataclass(frozen=True)
class InFlightState:
    """The plans out and the updates taken while version ``version`` (round ``round``) was filled."""

    version: int
    round: int
    bases: dict[Base, dict[str, np.ndarray]]
    plans: list[OpenPlanState]
    taken: list[TakenUpdate]
    #: plans the stopped session had sent in all (its next tag): the resumed one's tags start past it
    dispatches: int = 0

    def __post_init__(self) -> None:
        missing = {p.base for p in self.plans} | {t.base for t in self.taken if t.stale is None}
        if missing - set(self.bases):
            raise ValueError(f"plans or updates on models not kept: {sorted(missing - set(self.bases))}")


def save_in_flight(directory: Path, state: InFlightState) -> Path:
    """Write ``state`` beside the checkpoint in ``directory``; returns its path."""
    bases = [{"version": v, "label": label, "tensors": pack_tensors(t)} for (v, label), t in state.bases.items()]
    plans = [{"device": p.device, "tag": p.tag, "base": list(p.base), "age_s": float(p.age_s),
              "new_samples": p.new_samples, "plan": replace(p.plan, tensors={}).to_body()} for p in state.plans]
    taken = [{"device": t.received.device_id, "round": t.received.round, "nbytes": t.received.nbytes,
              "base": list(t.base), "stale": t.stale, "update": t.received.update.to_body()} for t in state.taken]
    header = {"format": _FORMAT, "version": state.version, "round": state.round, "dispatches": state.dispatches,
              "bases": bases, "plans": plans, "taken": taken}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / IN_FLIGHT_FILE
    write_bytes_atomically(path, encode_frame(header, CHECKPOINT_LIMITS.max_header_bytes))
    return path


def load_in_flight(directory: Path) -> InFlightState | None:
    """The state in ``directory``, None if there is none; ProtocolError if it is not one."""
    path = directory / IN_FLIGHT_FILE
    if not path.exists():
        return None
    limits = CHECKPOINT_LIMITS
    obj, data = decode_frame(path.read_bytes(), limits)
    if not isinstance(obj, dict) or obj.get("format") != _FORMAT:
        raise ProtocolError("version", f"{path}: not an edgefl in-flight state of format {_FORMAT}")
    try:  # the tensors are read in the order they were written: bases, then the updates
        bases = {(int(b["version"]), str(b["label"])): unpack_tensors(b["tensors"], data, limits)
                 for b in obj["bases"]}
        plans = [OpenPlanState(str(p["device"]), int(p["tag"]), _base(p["base"]),
                               replace(Plan.from_body(p["plan"], limits, data), tensors=bases[_base(p["base"])]),
                               float(p["age_s"]), int(p["new_samples"])) for p in obj["plans"]]
        taken = [TakenUpdate(ReceivedUpdate(str(t["device"]), int(t["round"]),
                                            Update.from_body(t["update"], limits, data), int(t["nbytes"])),
                             _base(t["base"]), None if t["stale"] is None else int(t["stale"]))
                 for t in obj["taken"]]
        data.finish()
        return InFlightState(int(obj["version"]), int(obj["round"]), bases, plans, taken, int(obj["dispatches"]))
    except ProtocolError as exc:
        raise ProtocolError(exc.code, f"{path}: {exc.message}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("malformed", f"{path}: {exc}") from exc


def _base(value: object) -> Base:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"a base is [version, label], got {value!r}")
    return int(value[0]), str(value[1])
