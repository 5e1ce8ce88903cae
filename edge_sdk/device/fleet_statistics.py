"""What a device answers a `StatsRequest` with: aggregates of its training data, never a sample —
the per-channel moments (``channel_moments``, for ``[task] mean = "fleet"``) or, for a MiniRocket
model's biases, the histograms of ``series_histograms`` (`edge_sdk.models.minirocket_biases`)."""

from __future__ import annotations

import numpy as np

from edge_sdk.data.channel_moments import channel_moments, raw_values
from edge_sdk.methods.base import LocalData
from edge_sdk.protocol.messages import FleetStats, StatsRequest

__all__ = ["MIN_SERIES", "fleet_statistics"]

#: the fewest training series a device shares ``series_histograms`` of: with one or two, its
#: histograms would show those series' own output distributions
MIN_SERIES = 3


def fleet_statistics(request: StatsRequest, data: LocalData) -> FleetStats:
    """The statistics ``request`` asks for, over ``data``; a one-line ValueError when the data
    cannot give them (e.g. images asked for series statistics)."""
    if request.kind == "channel_moments":
        moments = channel_moments(data)
        return FleetStats(request.kind, moments.count, moments.mean, moments.m2)
    from edge_sdk.models.minirocket import MiniRocketPlan  # torch: only a series model's job asks this
    from edge_sdk.models.minirocket_biases import series_statistics

    if np.ndim(data.x) != 3 or len(data.x) == 0:
        raise ValueError(f"series statistics need (C, L) series, this device holds {len(data.x)} samples of shape "
                         f"{tuple(np.shape(data.x)[1:])}")
    if len(data.x) < MIN_SERIES:
        raise ValueError(f"{len(data.x)} training series are fewer than the {MIN_SERIES} whose statistics a device "
                         "shares (they would show those series themselves)")
    series = raw_values(data).astype(np.float32)
    params = request.params
    plan = MiniRocketPlan(series.shape[1], series.shape[2], params["features"], params["max_dilations"],
                          params["seed"])
    return FleetStats(request.kind, len(series), (), (), series_statistics(plan, series))
