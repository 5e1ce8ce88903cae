"""The fixed tensors a device received, kept to fill the plans that leave them out.

A plan names its fixed tensors by digest (`Plan.fixed`); the first plan of a job carries them, the
device keeps them here and sends them back as their digests alone (`Update.fixed`), and from then
on the coordinator leaves them out of its plans to this device. A plan that leaves out one this
cache no longer holds (the device restarted, or it was evicted) is answered ``unknown_fixed``, and
the coordinator sends the plan whole. The cache is the process's (one per real device; the
simulated devices of one host share it, as they share its memory), bounded in entries and bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TypeVar

import numpy as np

from edge_sdk.protocol.messages import Evaluate, Plan, Update

__all__ = ["FixedCache", "MissingFixed", "PROCESS_FIXED_CACHE", "Received"]

#: what brings a model: a plan, or an evaluation request (`Evaluate`, which names its fixed tensors alike)
Received = TypeVar("Received", Plan, Evaluate)


class MissingFixed(KeyError):
    """A plan left out fixed tensors the cache does not hold."""

    def __str__(self) -> str:
        return str(self.args[0])


class FixedCache:
    """Fixed tensors by digest, least recently used dropped first beyond ``max_entries`` or ``max_bytes``."""

    def __init__(self, max_entries: int = 64, max_bytes: int = 64 << 20) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._tensors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # simulated devices of one host train on their own threads

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            return digest in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def clear(self) -> None:
        """Forget every tensor (what a restarted device holds)."""
        with self._lock:
            self._tensors.clear()
            self._bytes = 0

    def remember(self, plan: Plan | Evaluate) -> None:
        """Keep the fixed tensors ``plan`` carries (a read-only copy of each)."""
        for name, digest in plan.fixed.items():
            tensor = plan.tensors.get(name)
            if tensor is None or tensor.nbytes > self.max_bytes:
                continue
            with self._lock:
                if digest in self._tensors:
                    self._tensors.move_to_end(digest)
                    continue
                kept = np.array(tensor, copy=True)
                kept.flags.writeable = False
                self._tensors[digest] = kept
                self._bytes += kept.nbytes
                while len(self._tensors) > self.max_entries or self._bytes > self.max_bytes:
                    self._bytes -= self._tensors.popitem(last=False)[1].nbytes

    def resolve(self, plan: Received) -> Received:
        """``plan`` with the fixed tensors it left out filled in, the ones it carries kept first
        (`remember`); MissingFixed names those not held. An evaluation request's ``baseline`` gets
        the fixed tensors it left out from the request's own."""
        self.remember(plan)
        left_out = {name: digest for name, digest in plan.fixed.items() if name not in plan.tensors}
        if not left_out:
            return _with_baseline(plan)
        with self._lock:
            found = {name: self._tensors[d] for name, d in left_out.items() if d in self._tensors}
            for digest in left_out.values():
                if digest in self._tensors:
                    self._tensors.move_to_end(digest)
        if len(found) < len(left_out):
            missing = sorted(set(left_out) - set(found))
            raise MissingFixed(f"the plan left out fixed tensors this device does not hold: {', '.join(missing)}")
        return _with_baseline(replace(plan, tensors={**plan.tensors, **found}))

    def strip(self, plan: Plan, update: Update) -> Update:
        """``update`` without the fixed tensors of ``plan`` (resolved) it sends back unchanged and
        this cache holds, which it names by digest instead."""
        same = {name: digest for name, digest in plan.fixed.items()
                if name in update.tensors and name in plan.tensors and digest in self
                and update.tensors[name].shape == plan.tensors[name].shape
                and np.array_equal(update.tensors[name], plan.tensors[name])}
        if not same:
            return update
        return replace(update, tensors={k: v for k, v in update.tensors.items() if k not in same},
                       fixed={**update.fixed, **same})


def _with_baseline(plan: Received) -> Received:
    """An evaluation request whose ``baseline`` leaves out fixed tensors, with them taken from its own
    (the served version has the job's fixed tensors); anything else as it is."""
    if not isinstance(plan, Evaluate) or plan.baseline is None:
        return plan
    left_out = {name: plan.tensors[name] for name in plan.fixed if name not in plan.baseline and name in plan.tensors}
    return replace(plan, baseline={**plan.baseline, **left_out}) if left_out else plan


#: The cache of this process's devices.
PROCESS_FIXED_CACHE = FixedCache()
