"""Capacity → level: which model size (a width, a level, ...) each device trains.

Devices report *measured* FLOPS; :func:`assign_levels` groups them into as many
groups as there are levels (ordered from the smallest model to the largest):

- ``budget``: the largest level whose training cost fits a per-round time budget,
  ``cost[level] × work[device] / gflops[device] <= budget_s`` (the smallest level if
  none fits). Absolute: a device's level does not depend on the rest of the fleet.
- ``cluster``: optimal 1-D k-means of log10(GFLOPS) (exact, by dynamic programming)
  into ``len(levels)`` groups, the slowest group training the smallest level. With
  fewer distinct capacities than levels the groups are spread over the levels, the
  fastest group always on the largest. Relative to the fleet.
- ``quantile``: equal-size groups by FLOPS rank (equal capacities stay together).
  Relative to the fleet.

An admin ``override`` pins devices to levels. :class:`LevelAssigner` keeps the
fleet's records and applies the result to them; in dynamic mode a device that
re-registers with a new profile (CPU load, thermal throttling, battery) is
re-assigned for the next round, in static mode labels are frozen once training starts.
A device that measures itself again (`ProfileUpdate`: idle, the figure moved) is placed
again by its new figure in both modes (:meth:`LevelAssigner.reassess`).

The assigned level is a device's *capacity*. With ``sample=random`` a device trains,
each round, a level drawn uniformly from the levels up to its capacity (never a larger
one), so every smaller model also learns from the data of faster devices — the way
the FLANC and HeteroFL papers sample a width per client per round, bounded by what
the device measured it can afford. ``sample=any`` draws from every level whatever the
capacity, for fleets where every device can afford every level. ``sample=every`` is the
official FLANC code's protocol: like ``any``, but the round's participants are drawn
together, again until every level appears in the round (when there are at least as many
participants as levels). ``sample=fixed`` (default) trains the capacity level.
"""

from __future__ import annotations

import logging
import zlib
from typing import Mapping, Sequence

import numpy as np

from edge_sdk.methods.settings.shared import MODES, AssignmentConfig, positive_number

from coordinator.core.device_record import DeviceRecord

__all__ = ["assign_levels", "LevelAssigner"]

log = logging.getLogger(__name__)


def _kmeans_1d(values: np.ndarray, k: int) -> np.ndarray:
    """Cluster index (0 = smallest values) of each value: exact 1-D k-means by DP."""
    order = np.argsort(values, kind="stable")
    x = values[order]
    n = len(x)
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def sse(i: np.ndarray, j: int) -> np.ndarray:  # cost of x[i:j] for every start in i
        m = j - i
        return s2[j] - s2[i] - (s1[j] - s1[i]) ** 2 / m

    cost = np.full((k + 1, n + 1), np.inf)
    back = np.zeros((k + 1, n + 1), dtype=np.int64)
    cost[0, 0] = 0.0
    for c in range(1, k + 1):
        for j in range(c, n + 1):
            i = np.arange(c - 1, j)
            total = cost[c - 1, i] + sse(i, j)
            best = int(np.argmin(total))
            cost[c, j], back[c, j] = total[best], i[best]
    labels = np.empty(n, dtype=np.int64)
    j = n
    for c in range(k, 0, -1):
        i = back[c, j]
        labels[i:j] = c - 1
        j = i
    out = np.empty(n, dtype=np.int64)
    out[order] = labels
    return out


def assign_levels(gflops_by_device: Mapping[str, float], levels: Sequence[str],
                  cost_per_level: Mapping[str, float] | None = None, budget_s: float | None = None,
                  override: Mapping[str, str] | None = None, *, mode: str | None = None,
                  work_by_device: Mapping[str, float] | None = None) -> dict[str, str]:
    """The level of every device (see the module docstring).

    ``levels`` go from the smallest model to the largest. ``cost_per_level`` is the
    training cost (GFLOP) of one unit of work, ``work_by_device`` the units a device does
    per round (e.g. samples × epochs; default 1). ``mode`` defaults to ``budget`` when a
    budget is given, else ``cluster``. Overridden devices take their pinned level and are
    left out of the grouping.
    """
    levels = list(levels)
    if not levels or len(set(levels)) != len(levels) or not all(isinstance(v, str) for v in levels):
        raise ValueError(f"levels must be distinct strings, at least one; got {levels!r}")
    mode = mode or ("budget" if budget_s is not None else "cluster")
    if mode not in MODES:
        raise ValueError(f"assignment mode must be one of {MODES}, got {mode!r}")
    gflops = {d: positive_number(f"gflops of {d!r}", g) for d, g in gflops_by_device.items()}
    override = dict(override or {})
    bad = {d: v for d, v in override.items() if v not in levels}
    if bad:
        raise ValueError(f"override pins devices to unknown levels {bad}; levels are {levels}")
    result = {d: override[d] for d in gflops if d in override}
    free = sorted(d for d in gflops if d not in override)
    if not free:
        return result
    if mode == "budget":
        if budget_s is None or cost_per_level is None:
            raise ValueError("budget assignment needs budget_s and cost_per_level")
        budget = positive_number("budget_s", budget_s)
        costs = [positive_number(f"cost of level {v!r}", cost_per_level[v]) for v in levels]
        work = work_by_device or {}
        for d in free:
            w = positive_number(f"work of {d!r}", work.get(d, 1.0))
            fits = [i for i, c in enumerate(costs) if c * w / gflops[d] <= budget]
            result[d] = levels[max(fits) if fits else 0]
        return result
    caps = np.array([gflops[d] for d in free])
    if mode == "quantile":
        ranked = sorted(free, key=lambda d: (gflops[d], d))
        first = {}  # equal capacities share the group of the first of them
        for rank, d in enumerate(ranked):
            first.setdefault(gflops[d], rank)
            result[d] = levels[first[gflops[d]] * len(levels) // len(ranked)]
        return result
    k = min(len(levels), len(np.unique(caps)))
    groups = _kmeans_1d(np.log10(caps), k)
    for d, g in zip(free, groups, strict=True):
        index = len(levels) - 1 if k == 1 else round(int(g) * (len(levels) - 1) / (k - 1))
        result[d] = levels[index]
    return result


class LevelAssigner:
    """The fleet's level groups, kept up to date as devices (re-)register."""

    def __init__(self, config: AssignmentConfig, levels: Sequence[str],
                 cost_per_level: Mapping[str, float] | None = None, epochs: float = 1.0) -> None:
        self.config = config
        self.levels = list(levels)
        self.cost_per_level = dict(cost_per_level or {})
        self.epochs = epochs
        self.records: dict[str, DeviceRecord] = {}
        self.frozen = False
        self._drawn: tuple[int, dict[str, str]] = (-1, {})  # sample=every: (round, device -> level)
        self._relabelled: dict[str, str] = {}  # other devices' new levels, until `take_relabelled`
        assign_levels({}, self.levels, override=dict(config.override))  # validates the override

    def _compute(self) -> dict[str, str]:
        return assign_levels(
            {d: r.profile.gflops for d, r in self.records.items()}, self.levels,
            self.cost_per_level or None, self.config.budget_s, dict(self.config.override),
            mode=self.config.mode,
            work_by_device={d: r.num_samples * self.epochs for d, r in self.records.items()})

    def observe(self, device: DeviceRecord) -> str:
        """Record a (re-)registration; returns the device's level (others may be relabelled:
        :meth:`take_relabelled`)."""
        known = device.device_id in self.records and device.label in self.levels
        self.records[device.device_id] = device
        labels = self._compute()
        if self.frozen and not self.config.dynamic:
            return device.label if known else labels[device.device_id]  # type: ignore[return-value]
        self._relabel(device.device_id, labels, say=False)  # the fleet is still registering
        return labels[device.device_id]

    def _relabel(self, observed: str, labels: Mapping[str, str], say: bool = True) -> None:
        """The other devices whose level ``labels`` changes, for the round loop to write."""
        for d, record in self.records.items():
            if d != observed and self._relabelled.get(d, record.label) != labels[d]:
                if say:
                    log.info("device %s: level %s -> %s (the fleet's figures changed)", d, record.label, labels[d])
                self._relabelled[d] = labels[d]

    def take_relabelled(self) -> dict[str, str]:
        """The other devices' new levels since the last call (device -> level), once."""
        relabelled, self._relabelled = self._relabelled, {}
        return relabelled

    def reassess(self, device: DeviceRecord) -> str:
        """A registered device measured itself again (`ProfileUpdate`): its level from the new
        figure. Before training starts, or in dynamic mode, every device is relabelled as by
        :meth:`observe`; once static labels are frozen only this device moves (as a device that
        joins late is placed by its capacity) and the others keep theirs."""
        self.records[device.device_id] = device
        labels = self._compute()
        if not self.frozen or self.config.dynamic:
            self._relabel(device.device_id, labels)
        return labels[device.device_id]

    def draw_round(self, participants: Sequence[str], rnd: int, seed: int = 0) -> None:
        """``sample=every``: draw the levels of round ``rnd``'s participants together, uniformly,
        again until every level appears (or, with fewer participants than levels, no level twice).
        The draw depends only on (seed, round, participant ids), so a resumed job repeats it."""
        if self.config.sample != "every":
            return
        ids = sorted(participants)
        need = min(len(ids), len(self.levels))
        rng = np.random.default_rng([seed, rnd, 0x5EED])
        draw = rng.integers(len(self.levels), size=len(ids))
        while len(set(draw.tolist())) < need:
            draw = rng.integers(len(self.levels), size=len(ids))
        self._drawn = (rnd, {d: self.levels[int(i)] for d, i in zip(ids, draw, strict=True)})

    def round_level(self, device: DeviceRecord, rnd: int, seed: int = 0) -> str:
        """The level ``device`` trains in round ``rnd``: its capacity level, or with
        ``sample=random`` one drawn uniformly from the levels up to it (``any``: from all
        levels; ``every``: what :meth:`draw_round` drew for the round). The draw depends only
        on (seed, round, device id), so a resumed job repeats it."""
        capacity = device.label if device.label in self.levels else self.observe(device)
        if self.config.sample == "fixed":
            return capacity
        drawn_rnd, drawn = self._drawn
        if self.config.sample == "every" and drawn_rnd == rnd and device.device_id in drawn:
            return drawn[device.device_id]
        bounded = self.config.sample == "random"  # any, every: all levels
        allowed = self.levels[:self.levels.index(capacity) + 1] if bounded else self.levels
        rng = np.random.default_rng([seed, rnd, zlib.crc32(device.device_id.encode())])
        return allowed[int(rng.integers(len(allowed)))]

    def freeze(self) -> None:
        """Training started: in static mode, labels no longer change."""
        self.frozen = True

    def groups(self) -> dict[str, list[str]]:
        """Level -> device ids currently assigned to it."""
        out: dict[str, list[str]] = {v: [] for v in self.levels}
        for d, record in sorted(self.records.items()):
            if record.label in out:
                out[record.label].append(d)
        return out
