"""MiniRocket as a fixed layer (edge_sdk/models/minirocket.py) and its biases from statistics a fleet
can sum (edge_sdk/models/minirocket_biases.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from edge_sdk.models import build_model
from edge_sdk.models.minirocket import KERNEL_LENGTH, NUM_KERNELS, MiniRocket, MiniRocketPlan, _kernel_weights
from edge_sdk.models.minirocket_biases import (GRID, biases_from_histograms, fleet_biases, histograms,
                                               merge_histograms, pooled_biases, series_statistics)
from edge_sdk.models.zoo import model_for_dataset


def _series(n: int, channels: int = 1, length: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    freq = rng.uniform(0.02, 0.3, size=(n, channels, 1))
    return (rng.uniform(0.5, 50, size=(n, channels, 1)) * np.sin(2 * np.pi * freq * t)
            + rng.normal(0, 0.3, size=(n, channels, length))).astype(np.float32)


def test_the_plan_follows_from_the_length_and_the_feature_count() -> None:
    plan = MiniRocketPlan(1, 300)
    dilations = [d for d, _ in plan.dilations]
    assert dilations == sorted(set(dilations)) and dilations[0] == 1
    assert (KERNEL_LENGTH - 1) * dilations[-1] <= 300 - 1  # the largest kernel still fits the series
    assert plan.features == NUM_KERNELS * (9_996 // NUM_KERNELS) == 9_996
    points = plan.quantiles()
    assert len(set(points.round(12))) == plan.features and 0 < points.min() and points.max() < 1
    with pytest.raises(ValueError, match="at least 9 values"):
        MiniRocketPlan(1, 8)


def test_the_84_kernels_are_every_choice_of_three_places_for_the_twos() -> None:
    weights = _kernel_weights()[:, 0].numpy()
    assert len({tuple(w) for w in weights}) == NUM_KERNELS == math.comb(9, 3)
    assert ((weights == 2).sum(axis=1) == 3).all() and ((weights == -1).sum(axis=1) == 6).all()
    assert np.allclose(weights.sum(axis=1), 0)  # a constant offset gives 0 away from the padded ends


def _ppv_by_hand(x: np.ndarray, kernel: np.ndarray, dilation: int, bias: float, padded: bool) -> float:
    length, pad = len(x), 4 * dilation
    wide = np.concatenate([np.zeros(pad), x, np.zeros(pad)])
    out = np.array([sum(kernel[j] * wide[t + j * dilation] for j in range(9)) for t in range(length)])
    if not padded:
        out = out[pad:length - pad]
    return float((out > bias).mean())


def test_each_feature_is_the_ppv_of_one_dilated_convolution_less_its_bias() -> None:
    plan = MiniRocketPlan(1, 60, num_features=840)
    layer = MiniRocket(plan)
    layer.biases.copy_(torch.as_tensor(pooled_biases(layer, _series(20, length=60))))
    x = _series(2, length=60, seed=5)
    features = (layer(torch.as_tensor(x)) + layer._expected).numpy()  # the PPVs themselves
    kernels = _kernel_weights()[:, 0].numpy()
    checked = set()
    for d, k, rank, features_of in plan.combination_slices():  # kernel-major: kernel, dilation, bias
        if rank not in (0, 1, 83):  # a padded and an unpadded combination at every dilation
            continue
        dilation = plan.dilations[d][0]
        for first in (features_of.start, features_of.stop - 1):
            for n in range(2):
                expected = _ppv_by_hand(x[n, 0], kernels[k], dilation, float(layer.biases[first]), plan.padded(d, k))
                assert features[n, first] == pytest.approx(expected, abs=1e-6)
        checked.add((d, plan.padded(d, k)))
    assert len(checked) == 2 * len(plan.dilations)
    assert features_of.stop == plan.features  # the slices cover every feature


def test_several_channels_sum_a_fixed_random_subset_of_them() -> None:
    plan = MiniRocketPlan(6, 100, seed=3)
    assert (plan.channel_masks.sum(axis=2) >= 1).all() and (plan.channel_masks.sum(axis=2) <= 6).all()
    assert np.array_equal(plan.channel_masks, MiniRocketPlan(6, 100, seed=3).channel_masks)
    assert not np.array_equal(plan.channel_masks, MiniRocketPlan(6, 100, seed=4).channel_masks)
    model = build_model(model_for_dataset("minirocket", (6, 100), 4))
    assert model(torch.as_tensor(_series(3, channels=6, length=100))).shape == (3, 4)


def test_the_zoo_family_trains_only_its_head_and_carries_the_biases_in_its_state() -> None:
    spec = model_for_dataset("minirocket", (1, 300), 11)
    model = build_model(spec)
    assert [n for n, _ in model.named_parameters()] == ["layers.1.weight", "layers.1.bias"]
    assert list(model.state_dict()) == ["layers.0.biases", "layers.1.weight", "layers.1.bias"]
    assert spec["layers"][1]["in"] == 9_996
    small = model_for_dataset("minirocket", (1, 300), 11, width=0.25)
    assert small["layers"][0]["kernels"] == 21 and small["layers"][1]["in"] == 21 * (9_996 // 84)


def test_a_narrower_layer_computes_a_prefix_of_the_full_layers_features_at_a_share_of_its_flops() -> None:
    from edge_sdk.models.spec import count_flops

    x = torch.as_tensor(_series(4, channels=3, length=90, seed=6))
    full_spec = model_for_dataset("minirocket", (3, 90), 5, features=840)
    full = build_model(full_spec).layers[0]
    full.biases.copy_(torch.as_tensor(pooled_biases(full, _series(12, channels=3, length=90))))
    expected = full(x)
    for width in (0.25, 0.5, 0.75):
        spec = model_for_dataset("minirocket", (3, 90), 5, features=840, width=width)
        narrow = build_model(spec).layers[0]
        narrow.biases.copy_(full.biases[:narrow.plan.features])  # HeteroFL's prefix slice of the state
        np.testing.assert_array_equal(narrow(x).numpy(), expected[:, :narrow.plan.features].numpy())
        # the same biases fitted on the narrow layer's own are the prefix too
        assert np.allclose(pooled_biases(narrow, _series(12, channels=3, length=90)),
                           full.biases[:narrow.plan.features].numpy(), atol=1e-5)
        kept = narrow.plan.kernels / NUM_KERNELS
        assert count_flops(spec) == pytest.approx(kept * count_flops(full_spec), rel=0.01)


def test_merged_histograms_are_those_of_the_union_of_the_series() -> None:
    layer = MiniRocket(MiniRocketPlan(1, 120, num_features=840), series_norm=True)
    a, b = _series(7, seed=1), _series(13, seed=2)
    merged = merge_histograms([(histograms(layer, a), 7.0), (histograms(layer, b), 13.0)])
    np.testing.assert_allclose(merged, histograms(layer, np.concatenate([a, b])), atol=1e-6)


def test_a_part_sent_at_another_scale_weighs_no_more_than_its_weight() -> None:
    layer = MiniRocket(MiniRocketPlan(1, 120, num_features=840), series_norm=True)
    honest = histograms(layer, _series(20, seed=8))
    hostile = np.zeros_like(honest)
    hostile[:, 0] = 1e30  # every output in the lowest bin, a thousand billion billion times over
    merged = merge_histograms([(honest, 99.0), (hostile, 1.0)])
    np.testing.assert_allclose(merged[:, 0], 0.99 * honest[:, 0] + 0.01, atol=1e-6)
    np.testing.assert_allclose(merge_histograms([(honest, 99.0), (hostile / 1e30, 1.0)]), merged, atol=1e-9)


def test_biases_read_off_the_histograms_are_the_pooled_quantiles_within_a_bin() -> None:
    layer = MiniRocket(MiniRocketPlan(1, 120, num_features=840), series_norm=True)
    series = _series(30, seed=3)
    from_histograms = biases_from_histograms(layer.plan, histograms(layer, series))
    exact = pooled_biases(layer, series)
    widths = np.diff(GRID)[np.clip(np.searchsorted(GRID, exact) - 1, 0, len(GRID) - 2)]
    assert (np.abs(from_histograms - exact) <= widths + 1e-5).all()


def test_the_fleets_biases_follow_the_jobs_normalisation_and_the_seed() -> None:
    plan = MiniRocketPlan(1, 120, num_features=840)
    stats = series_statistics(plan, _series(40, seed=4))
    base = fleet_biases(plan, stats["shares"], stats["scales"], np.ones(1), seed=0)
    halved = fleet_biases(plan, stats["shares"], stats["scales"], np.full(1, 0.5), seed=0)
    np.testing.assert_allclose(halved, 2 * base, rtol=1e-5)  # inputs divided by 0.5: outputs twice as large
    assert not np.allclose(fleet_biases(plan, stats["shares"], stats["scales"], np.ones(1), seed=1), base)
    standardised = fleet_biases(plan, stats["shares"], stats["scales"], np.ones(1), seed=0, series_norm=True)
    np.testing.assert_allclose(standardised, biases_from_histograms(plan, stats["shares"]))


def test_the_onnx_model_computes_the_same_features(tmp_path) -> None:
    from coordinator.runtime.export import export_onnx
    from edge_sdk.inference import OnnxClassifier

    torch.manual_seed(0)
    model = build_model(model_for_dataset("minirocket", (1, 120), 3, features=840)).eval()
    series = _series(20, length=120, seed=6)
    plan = model.layers[0].plan
    stats = series_statistics(plan, series)
    model.layers[0].biases.copy_(torch.as_tensor(fleet_biases(plan, stats["shares"], stats["scales"], np.ones(1), 0)))
    export_onnx(model, tmp_path / "m.onnx", series[:4])
    with torch.no_grad():
        expected = torch.softmax(model(torch.as_tensor(series)), dim=1).numpy()
    got = OnnxClassifier(tmp_path / "m.onnx").predict(series).probabilities
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_training_computes_the_fixed_features_once_and_learns_the_same(monkeypatch) -> None:
    from edge_sdk.train_config import TrainConfig
    from edge_sdk.training import train_local

    x = _series(40, length=120, seed=7)
    y = (np.arange(40) % 2).astype(np.int64)
    spec = model_for_dataset("minirocket", (1, 120), 2, features=840)
    trained = []
    calls = {"n": 0}
    forward = MiniRocket.forward

    def counted(self, inputs):
        calls["n"] += 1
        return forward(self, inputs)

    monkeypatch.setattr(MiniRocket, "forward", counted)
    for fixed in (True, False):
        monkeypatch.setattr(MiniRocket, "FIXED_FEATURES", fixed)
        torch.manual_seed(0)
        model = build_model(spec)
        model.layers[0].biases.copy_(torch.as_tensor(pooled_biases(model.layers[0], x)))
        calls["n"] = 0
        train_local(model, x, y, TrainConfig(epochs=4, batch_size=8, lr=0.05), seed=1)
        trained.append((calls["n"], model.layers[1].weight.detach().clone()))
    (once, fixed_weights), (every_step, weights) = trained
    assert once == 5 and every_step == 4 * 5  # 40 series in batches of 8: once, against once a step
    torch.testing.assert_close(fixed_weights, weights, rtol=1e-5, atol=1e-6)


def test_batch_norm_over_the_features_before_the_head() -> None:
    spec = model_for_dataset("minirocket", (1, 120), 3, norm="batchnorm")
    assert [layer["type"] for layer in spec["layers"]] == ["minirocket", "batchnorm1d", "linear"]
    model = build_model(spec)
    assert model(torch.from_numpy(_series(4))).shape == (4, 3)
    with pytest.raises(ValueError, match="minirocket's norm is batchnorm"):
        model_for_dataset("minirocket", (1, 120), 3, norm="groupnorm")


def test_simulated_device_time_counts_the_transform_once_a_sample_and_the_head_every_epoch() -> None:
    from edge_sdk.methods.base import DeviceContext, compute_seconds, fixed_flops
    from edge_sdk.models.spec import count_flops, layer_stats
    from edge_sdk.profiling import load_profile
    from edge_sdk.throttle import Throttle
    from edge_sdk.training import FIXED_LAYER_TYPES

    spec = model_for_dataset("minirocket", (1, 300), 11)
    model = build_model(spec)
    assert [type(m).__name__ for m in model.layers if getattr(m, "FIXED_FEATURES", False)] == ["MiniRocket"]
    assert [layer["type"] for layer in spec["layers"][:1]] == list(FIXED_LAYER_TYPES)
    assert sum(layer["flops"] for layer in layer_stats(spec)) == count_flops(spec)  # what compute_seconds sums
    transform, total = fixed_flops(layer_stats(spec)), count_flops(spec)
    head = total - transform
    assert transform > 20 * head  # the transform is nearly all of it (43x at 300 values)
    ctx = DeviceContext("d", 0, throttle=Throttle(load_profile("raspberry-pi-4b"), mode="virtual"))
    gflops = ctx.throttle.profile.gflops * 1e9
    once = compute_seconds(ctx, spec, 0.0, trained=5 * 40, distinct=40)  # 5 epochs of 40 series
    assert once == pytest.approx((head * 3 * 200 + transform * 40) / gflops)
    every = compute_seconds(ctx, spec, 0.0, trained=5 * 40)  # a caller that does not say: every epoch, as before
    assert every == pytest.approx(total * 3 * 200 / gflops) and every > 10 * once
    cnn = model_for_dataset("cnn1d", (1, 300), 11)  # no fixed prefix: nothing changes
    assert compute_seconds(ctx, cnn, 0.0, trained=200, distinct=40) == compute_seconds(ctx, cnn, 0.0, trained=200)
