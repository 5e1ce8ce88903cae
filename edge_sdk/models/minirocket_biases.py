"""MiniRocket's biases: quantiles of each (dilation, kernel) combination's convolution outputs.

Three ways to get them, each a function of the series it sees:

- `histograms` / `biases_from_histograms`: what a fleet does. Each device bins the convolution
  outputs of *all* its (standardised) training series on one fixed grid (`GRID`, fine near zero,
  coarse far out), one histogram per combination, summing to one; the coordinator sums the
  devices' histograms (weighing each by the samples it is believed to hold) and reads every
  feature's quantile off the merged one. A sum is all it takes, so no device's series is seen,
  only where its outputs fall, pooled over everything it holds.
- `pooled_biases`: the exact quantiles of the pooled outputs of the given series (the central
  reference the histograms approximate).
- `example_biases`: sktime's way: each combination's quantiles from the outputs of *one* random
  training series (the series' own data, which a fleet cannot share).
"""

from __future__ import annotations

import numpy as np
import torch

from edge_sdk.models.minirocket import NUM_KERNELS, MiniRocket, MiniRocketPlan

__all__ = ["GRID", "SCALE_GRID", "histograms", "merge_histograms", "biases_from_histograms", "pooled_biases",
           "example_biases", "scale_histograms", "series_statistics", "fleet_biases"]

#: bin edges of the fleet's histograms: 256 bins evenly spaced in asinh over +-200 (standardised
#: series: the 9 weights sum to 0 and their magnitudes to 12, so outputs past +-200 are rare; they
#: land in the outer bins)
GRID = np.sinh(np.linspace(-np.arcsinh(200.0), np.arcsinh(200.0), 257))

_CHUNK = 256


def _outputs(module: MiniRocket, series: np.ndarray, dilation_index: int) -> torch.Tensor:
    """``(N, kernels, L)`` convolution outputs of standardised series at one dilation (in chunks), the
    kept kernels in their order (`MiniRocketPlan.kept_kernels`)."""
    parts = []
    with torch.no_grad():
        for start in range(0, len(series), _CHUNK):
            x = torch.as_tensor(series[start:start + _CHUNK], dtype=torch.float32)
            z, _ = module.standardised(x)
            parts.append(module.convolutions(z, dilation_index))
    return torch.cat(parts)


def histograms(module: MiniRocket, series: np.ndarray) -> np.ndarray:
    """``(combinations, 256)`` float32: per combination (row ``dilation index * 84 + kernel``) the share
    of all outputs in each `GRID` bin; rows of kernels ``module`` does not keep stay zero."""
    edges = torch.as_tensor(GRID[1:-1], dtype=torch.float32)
    plan = module.plan
    out = np.zeros((plan.combinations, len(GRID) - 1), dtype=np.float64)
    for d in range(len(plan.dilations)):
        outputs = _outputs(module, series, d)  # (N, kernels, L)
        bins = torch.bucketize(outputs.permute(1, 0, 2).reshape(plan.kernels, -1).contiguous(), edges)
        for rank, k in enumerate(plan.kept_kernels):
            out[d * NUM_KERNELS + k] = np.bincount(bins[rank].numpy(), minlength=len(GRID) - 1)
    totals = out.sum(axis=1, keepdims=True)
    return (out / np.maximum(totals, 1)).astype(np.float32)


def merge_histograms(parts: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """The weighted sum of ``(histogram, weight)`` pairs, renormalised per combination. Each part's
    rows are brought to sum 1 first, so a part weighs its weight whatever the scale it was sent in."""
    total = 0.0
    for hist, weight in parts:
        rows = hist.astype(np.float64)
        total = total + weight * rows / np.maximum(rows.sum(axis=1, keepdims=True), 1e-300)
    return total / np.maximum(total.sum(axis=1, keepdims=True), 1e-300)


def biases_from_histograms(plan: MiniRocketPlan, merged: np.ndarray) -> np.ndarray:
    """Every feature's bias: its quantile point read off its combination's histogram (the CDF
    linear within a bin)."""
    quantiles = plan.quantiles()
    biases = np.zeros(plan.features, dtype=np.float32)
    for d, k, _, features in plan.combination_slices():
        cdf = np.concatenate([[0.0], np.cumsum(merged[d * NUM_KERNELS + k])])
        cdf /= max(cdf[-1], 1e-300)
        # the first edge the CDF reaches at each point, interpolated within the bin
        biases[features] = np.interp(quantiles[features], cdf, GRID)
    return biases


def pooled_biases(module: MiniRocket, series: np.ndarray) -> np.ndarray:
    """Exact quantiles of the pooled outputs of all ``series`` (central; no histogram)."""
    plan = module.plan
    quantiles = plan.quantiles()
    biases = np.zeros(plan.features, dtype=np.float32)
    outputs = [_outputs(module, series, d).permute(1, 0, 2).reshape(plan.kernels, -1).numpy()
               for d in range(len(plan.dilations))]  # a dilation's outputs, once for its kernels
    for d, _, rank, features in plan.combination_slices():
        biases[features] = np.quantile(outputs[d][rank], quantiles[features])
    return biases


def example_biases(module: MiniRocket, series: np.ndarray, seed: int = 0) -> np.ndarray:
    """sktime's choice: each combination's quantiles from one random series' outputs."""
    plan = module.plan
    rng = np.random.default_rng(seed)
    quantiles = plan.quantiles()
    biases = np.zeros(plan.features, dtype=np.float32)
    for d, _, rank, features in plan.combination_slices():
        one = series[rng.integers(len(series))][None]
        biases[features] = np.quantile(_outputs(module, one, d)[0, rank].numpy(), quantiles[features])
    return biases


# ----------------------------------------------------------------- the fleet's way, whole
#: bin edges of the series' log scales (natural log of a channel's standard deviation, raw units):
#: 256 bins over [-30, 30], a factor of 1.26 each
SCALE_GRID = np.linspace(-30.0, 30.0, 257)


def scale_histograms(series: np.ndarray) -> np.ndarray:
    """``(C, 256)`` float32: per channel, the share of series whose log scale falls in each bin."""
    log_scale = np.log(np.asarray(series, np.float64).std(axis=2) + 1e-30)  # (N, C)
    out = np.stack([np.histogram(np.clip(log_scale[:, c], SCALE_GRID[0], SCALE_GRID[-1]), SCALE_GRID)[0]
                    for c in range(series.shape[1])]).astype(np.float64)
    return (out / np.maximum(out.sum(axis=1, keepdims=True), 1)).astype(np.float32)


def series_statistics(plan: MiniRocketPlan, series: np.ndarray) -> dict[str, np.ndarray]:
    """What a device sends for its MiniRocket biases (`FleetStats` ``series_histograms``): the
    ``shares`` of each combination's outputs of its standardised series in each `GRID` bin, and the
    ``scales`` of its series (`scale_histograms`), both over all of its training series."""
    module = MiniRocket(plan, series_norm=True)
    return {"shares": histograms(module, series), "scales": scale_histograms(series)}


def fleet_biases(plan: MiniRocketPlan, shares: np.ndarray, scales: np.ndarray, channel_std: np.ndarray,
                 seed: int, series_norm: bool = False) -> np.ndarray:
    """The biases from the fleet's merged statistics. With ``series_norm`` the layer standardises
    each series, and the biases are the quantiles of ``shares`` as they are. Without it (the
    default: the measured better features, BENCHMARKS.md "Series model family"), sktime's choice
    is imitated without seeing a series: sktime takes each combination's quantiles from one random
    training series, so each combination works at that series' scale; here each combination's
    standardised quantiles are multiplied by a scale drawn (``seed``) from the fleet's ``scales``,
    over ``channel_std`` (the job's normalisation, which the model's input went through)."""
    biases = biases_from_histograms(plan, shares)
    if series_norm:
        return biases
    rng = np.random.default_rng(seed)
    masks = plan.channel_masks.reshape(plan.combinations, plan.channels)
    cdfs = np.concatenate([np.zeros((len(scales), 1)), np.cumsum(scales, axis=1)], axis=1)
    cdfs /= np.maximum(cdfs[:, -1:], 1e-300)
    drawn = np.stack([np.interp(rng.random(plan.combinations), cdfs[c], SCALE_GRID) for c in range(plan.channels)],
                     axis=1)  # (combinations, C): a log scale per combination and channel
    drawn -= np.log(np.asarray(channel_std, np.float64))[None, :]
    per_combination = np.exp((drawn * masks).sum(axis=1) / masks.sum(axis=1))
    for d, k, _, features in plan.combination_slices():
        biases[features] *= per_combination[d * NUM_KERNELS + k]
    return biases
