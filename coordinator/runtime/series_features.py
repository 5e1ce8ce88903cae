"""A MiniRocket model's biases, fitted once before the first round from the fleet's statistics.

The coordinator asks every online device for ``series_histograms`` (`FleetStats`: where each
(dilation, kernel) combination's outputs of its standardised training series fall, and the spread
of its series' scales), sums them weighing each device no more than the samples it is believed to
hold, and computes every feature's bias (`edge_sdk.models.minirocket_biases.fleet_biases`). The
biases are part of the model's state: they go to the devices with the weights, into the
checkpoint (a resumed job keeps them) and into the exported ONNX model.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from coordinator.runtime.fleet import Fleet
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.models.layers import resolved
from edge_sdk.models.minirocket import MiniRocketPlan, layer_plan
from edge_sdk.models.minirocket_biases import GRID, SCALE_GRID, fleet_biases, merge_histograms
from edge_sdk.protocol.messages import FleetStats

__all__ = ["SERIES_HISTOGRAMS", "rocket_layers", "fit_rocket_biases"]

log = logging.getLogger("coordinator.runtime.round_loop")

SERIES_HISTOGRAMS = "series_histograms"


def rocket_layers(spec: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """``(state key of its biases, layer)`` of each top-level ``minirocket`` layer of ``spec``."""
    if not isinstance(spec, dict):
        return []
    return [(f"layers.{i}.biases", layer) for i, layer in enumerate(spec.get("layers", ()))
            if isinstance(layer, dict) and layer.get("type") == "minirocket"]


def _usable(device: str, stats: FleetStats, plan: MiniRocketPlan) -> bool:
    shares, scales = stats.tensors["shares"], stats.tensors["scales"]
    if shares.shape != (plan.combinations, len(GRID) - 1) or scales.shape != (plan.channels, len(SCALE_GRID) - 1):
        log.warning("%s: series statistics of shapes %s and %s left out (the model wants %s and %s)", device,
                    shares.shape, scales.shape, (plan.combinations, len(GRID) - 1),
                    (plan.channels, len(SCALE_GRID) - 1))
        return False
    return stats.count > 0


def fit_rocket_biases(fleet: Fleet, layer: dict[str, Any], job: Preprocessing, seed: int,
                      timeout_s: float) -> np.ndarray:
    """The biases of MiniRocket ``layer`` from the online devices' statistics (``job``: the
    normalisation the model's input goes through); a one-line ValueError when none sent any."""
    plan = layer_plan(layer)
    online = fleet.online()
    params = {"features": plan.num_features, "max_dilations": plan.max_dilations, "seed": plan.seed}
    got = {d: s for d, s in fleet.gather_stats(SERIES_HISTOGRAMS, online, timeout_s, params).items()
           if isinstance(s, FleetStats) and _usable(d, s, plan)}
    if not got:
        raise ValueError(f"the minirocket model's biases: none of the {len(online)} online devices sent statistics of "
                         "its series (an edgefl SDK of 0.6 or later sends them)")
    weights = [(s, float(s.count)) for s in got.values()]
    shares = merge_histograms([(s.tensors["shares"], w) for s, w in weights])
    scales = merge_histograms([(s.tensors["scales"], w) for s, w in weights])
    biases = fleet_biases(plan, shares, scales, np.asarray(job.std, np.float64), seed,
                          resolved(layer)["series_norm"])
    log.info("minirocket biases from the fleet: %d features from %d series of %d devices (of %d online)",
             plan.features, sum(s.count for s in got.values()), len(got), len(online))
    return biases
