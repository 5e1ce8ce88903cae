"""``[task] mean = "fleet"``: a coordinator without central data asks the devices for the
per-channel moments of their training data before the first round, merges them (weighing each
device no more than the samples it is believed to hold) and normalises the whole job with the
result — frozen with the job: kept in its checkpoint, never recomputed on resume."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from coordinator.runtime.fleet import Fleet
from edge_sdk.data.channel_moments import merge_moments
from edge_sdk.data.preprocessing import Preprocessing

__all__ = ["CHANNEL_MOMENTS", "normalisation_from_fleet", "stored_normalisation"]

log = logging.getLogger("coordinator.runtime.round_loop")

CHANNEL_MOMENTS = "channel_moments"


def normalisation_from_fleet(fleet: Fleet, placeholder: Preprocessing, timeout_s: float) -> Preprocessing:
    """The job's normalisation from its online devices' statistics (``placeholder`` gives the
    classes and input shape); a one-line ValueError when no device sent any."""
    online = fleet.online()
    got = fleet.gather_stats(CHANNEL_MOMENTS, online, timeout_s)
    if not got:
        raise ValueError(f"[task] mean = \"fleet\": none of the {len(online)} online devices sent statistics of its "
                         "data (an edgefl SDK of 0.5 or later sends them); give [task] mean and std instead")
    merged = merge_moments(list(got.values()))
    if len(merged.mean) != placeholder.channels:
        raise ValueError(f"[task] mean = \"fleet\": the devices' data has {len(merged.mean)} channels, the task "
                         f"{placeholder.channels}")
    job = replace(placeholder, mean=merged.mean, std=merged.std())
    log.info("normalisation from the fleet: %d samples of %d devices (of %d online): mean %s, std %s", merged.count,
             len(got), len(online), [round(m, 4) for m in job.mean][:8], [round(s, 4) for s in job.std][:8])
    return job


def stored_normalisation(job: dict[str, Any], placeholder: Preprocessing) -> Preprocessing | None:
    """The normalisation a checkpoint's job identity froze (None: none stored)."""
    stored = job.get("normalisation")
    if not isinstance(stored, dict):
        return None
    return replace(placeholder, mean=tuple(stored["mean"]), std=tuple(stored["std"]))
