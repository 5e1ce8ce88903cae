"""A job's fixed tensors in its plans: named by digest, left out for a device that holds them,
restored in the updates that send them back as digests (docs/protocol.md, ``plan`` ``fixed``).

A MiniRocket layer's biases are fitted once and held for the whole job; without this they
travelled in every plan and every update (9,996 float32 on PLAID). A device proves it holds a
fixed tensor by sending it back as its digest in an accepted update; from then on its plans leave
it out. It answers ``unknown_fixed`` when it no longer holds one (it restarted): the fleet forgets
what it held and sends the plan whole. An SDK that does not know ``fixed`` ignores the field,
sends the tensors back, and so is always sent them. An evaluation request's ``baseline`` (the
served version's tensors) leaves out each fixed tensor that equals the request's own: the device
takes it from the request.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

import numpy as np

from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.fixed_tensors import tensor_digest
from edge_sdk.protocol.messages import Evaluate, Plan, Update

from coordinator.aggregate.validation import UpdateRejected

__all__ = ["FixedTensors"]

#: what carries a model to a device: a plan, or an evaluation request (`Evaluate`)
Sent = TypeVar("Sent", Plan, Evaluate)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b))


class FixedTensors:
    """The fixed tensors' names, their digests, and which device holds which."""

    def __init__(self) -> None:
        #: the plan tensors that are fixed for the job (set once they are: `RoundLoop._fit_rocket_biases`)
        self.names: frozenset[str] = frozenset()
        self._digests: dict[tuple[str, tuple[int, ...]], tuple[np.ndarray, str]] = {}
        self._held: dict[str, dict[str, str]] = {}  # per device: name -> the digest it holds

    def _digest(self, name: str, tensor: np.ndarray) -> str:
        key = (name, tuple(tensor.shape))
        known = self._digests.get(key)
        if known is not None and _same(known[0], tensor):
            return known[1]
        digest = tensor_digest(tensor)
        self._digests[key] = (np.array(tensor, copy=True), digest)
        return digest

    def declare(self, plan: Sent) -> Sent:
        """``plan`` (or an evaluation request) naming the digest of each fixed tensor it carries; an
        evaluation request's ``baseline`` leaves out each one equal to the request's own."""
        fixed = {name: self._digest(name, plan.tensors[name]) for name in sorted(self.names & set(plan.tensors))}
        if not fixed:
            return plan
        if isinstance(plan, Evaluate) and plan.baseline:  # the served version's: the same biases, mostly
            same = {name for name in fixed if name in plan.baseline and _same(plan.baseline[name], plan.tensors[name])}
            if same:
                return replace(plan, fixed=fixed,
                               baseline={k: v for k, v in plan.baseline.items() if k not in same})
        return replace(plan, fixed=fixed)

    def for_device(self, device: str, plan: Sent) -> Sent:
        """The declared ``plan`` as sent to ``device``: without the fixed tensors it holds."""
        held = self._held.get(device)
        if not held or not plan.fixed:
            return plan
        left_out = {name for name, digest in plan.fixed.items() if held.get(name) == digest}
        if not left_out:
            return plan
        return replace(plan, tensors={k: v for k, v in plan.tensors.items() if k not in left_out})

    def restore(self, update: Update, plan: Plan | None) -> Update:
        """``update`` with the fixed tensors it names by digest taken from its ``plan`` (declared,
        as sent to it); UpdateRejected if one is not its plan's."""
        if not update.fixed:
            return update
        for name, digest in update.fixed.items():
            if plan is None or plan.fixed.get(name) != digest or name not in plan.tensors or name in update.tensors:
                raise UpdateRejected(ErrorCode.BAD_TENSORS, f"fixed tensor {name[:80]!r} with that digest is not "
                                     "one of its plan's, or was sent as well")
        return replace(update, tensors={**update.tensors, **{name: plan.tensors[name] for name in update.fixed}},
                       fixed={})

    def holds(self, device: str, fixed: dict[str, str]) -> None:
        """``device`` sent these fixed tensors back as digests in an accepted update: it holds them."""
        if fixed:
            self._held.setdefault(device, {}).update(fixed)

    def forget(self, device: str) -> None:
        """``device`` holds none (it said so, or it left the job): its next plans carry them all."""
        self._held.pop(device, None)
