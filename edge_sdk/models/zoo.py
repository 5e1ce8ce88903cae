"""Model zoo: functions returning validated architecture specs (plain data).

Widths: every hidden channel/feature count ``c`` becomes ``max(1, ceil(c * width))``;
input channels and ``num_classes`` never scale. Norm layers make conv biases
redundant, so convs have ``bias=False`` when ``norm`` is set. GroupNorm uses the
largest group count <= 8 dividing the channels (works at any width).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from edge_sdk.models.minirocket import NUM_KERNELS, MiniRocketPlan  # (registers the minirocket layer type)
from edge_sdk.models.spec import validate_spec
from edge_sdk.models.spec_file import is_spec_file, load_spec_file

__all__ = ["cnn4", "cnn1d", "flanc_cnn", "resnet_small", "mlp", "minirocket", "MODEL_FAMILIES", "model_for_dataset",
           "scale_width"]

_NORMS = (None, "batchnorm", "groupnorm")


def scale_width(channels: int, width: float) -> int:
    """``max(1, ceil(channels * width))`` (robust to float noise such as 0.1 * 30)."""
    if isinstance(width, bool) or not isinstance(width, (int, float)) \
            or not math.isfinite(width) or not 0 < width <= 16:
        raise ValueError(f"width must be a number in (0, 16], got {width!r}")
    return max(1, math.ceil(channels * width - 1e-9))


def _hw(image_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        return image_size, image_size
    if isinstance(image_size, (tuple, list)) and len(image_size) == 2:
        return int(image_size[0]), int(image_size[1])
    raise ValueError(f"image_size must be an int or (H, W), got {image_size!r}")


def _channels(channels: Sequence[int], width: float) -> list[int]:
    if not channels or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                               for c in channels):
        raise ValueError(f"channels must be a non-empty sequence of positive ints, got {channels!r}")
    return [scale_width(c, width) for c in channels]


def _norm(norm: str | None, c: int, dims: int = 2) -> list[dict]:
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    if norm == "batchnorm":
        return [{"type": f"batchnorm{dims}d", "channels": c}]
    if norm == "groupnorm":
        groups = next(g for g in range(min(8, c), 0, -1) if c % g == 0)
        return [{"type": "groupnorm", "groups": groups, "channels": c}]
    return []


def _conv(cin: int, cout: int, kernel: int, stride: int, norm: str | None) -> list[dict]:
    return [{"type": "conv2d", "in": cin, "out": cout, "kernel": kernel, "stride": stride,
             "padding": kernel // 2, "bias": norm is None}] + _norm(norm, cout)


def _spec(input_shape: Sequence[int], num_classes: int, layers: list[dict], name: str) -> dict:
    return validate_spec({"format": 1, "input_shape": list(input_shape),
                          "num_classes": num_classes, "layers": layers, "name": name})


def cnn4(in_channels: int = 1, num_classes: int = 10, image_size: int | Sequence[int] = 28,
         width: float = 1.0, channels: Sequence[int] = (32, 64, 64, 128),
         norm: str | None = None) -> dict:
    """The 4-conv CNN of FLANC's paper for 28x28 inputs.

    Four 3x3 convs (padding 1), each followed by [norm], ReLU and a 2x2 max-pool while
    the feature map is at least 2x2 (28 -> 14 -> 7 -> 3 -> 1), then flatten + linear.
    Default widths (32, 64, 64, 128): 130,890 parameters (0.5 MB of float32 per
    update) and 12.6 MFLOPs per 28x28 sample. Measured on a 2-core CPU: ~0.3 ms per
    training sample (a full 60k MNIST epoch in ~20 s); trained on only 4,000 MNIST
    images (SGD lr 0.01-0.05, momentum 0.9, batch 32) it reaches ~95 % on 1,000
    held-out images within 4 epochs. ``channels=(32, 64, 128, 256)`` triples the
    parameters (bad for MQTT traffic) for no accuracy gain at this scale.
    """
    h, w = _hw(image_size)
    layers: list[dict] = []
    cin = in_channels
    for c in _channels(channels, width):
        layers += _conv(cin, c, 3, 1, norm) + [{"type": "relu"}]
        if h >= 2 and w >= 2:
            layers.append({"type": "maxpool2d", "kernel": 2})
            h, w = h // 2, w // 2
        cin = c
    layers += [{"type": "flatten"}, {"type": "linear", "in": cin * h * w, "out": num_classes}]
    return _spec([in_channels, *_hw(image_size)], num_classes, layers, "cnn4")


def cnn1d(in_channels: int = 1, num_classes: int = 10, length: int = 300, width: float = 1.0,
          channels: Sequence[int] = (32, 64, 64, 128), kernel: int = 5, norm: str | None = "batchnorm",
          series_norm: bool = True) -> dict:
    """cnn4's counterpart for sensor series ``(C, L)``: with ``series_norm``, first each series
    standardised on its own with the log of its scale kept as channels (`SeriesNorm`: the
    appliances of PLAID differ in amplitude by orders of magnitude, and the shape of the
    waveform is what tells them apart), then four 1-D convs (``kernel``, padding
    ``kernel // 2``), each followed by [norm], ReLU and a max-pool of 2 while the series is at
    least 2 long, then a global average over time and a linear classifier (so the classifier's
    size does not grow with the length: 300 or 1,460 values give the same parameters).
    Default widths (32, 64, 64, 128) with batch norm: 73,995 parameters for one channel and 11
    classes, and 9.4 MFLOPs per series of 300 values.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if isinstance(kernel, bool) or not isinstance(kernel, int) or not 1 <= kernel <= 63 or kernel % 2 == 0:
        raise ValueError(f"kernel must be an odd int in [1, 63], got {kernel!r}")
    layers: list[dict] = [{"type": "series_norm", "log_scale": True}] if series_norm else []
    cin, size = (2 * in_channels if series_norm else in_channels), length
    for c in _channels(channels, width):
        layers += [{"type": "conv1d", "in": cin, "out": c, "kernel": kernel, "padding": kernel // 2,
                    "bias": norm is None}] + _norm(norm, c, dims=1) + [{"type": "relu"}]
        if size >= 2:
            layers.append({"type": "maxpool1d", "kernel": 2})
            size //= 2
        cin = c
    layers += [{"type": "global_avgpool"}, {"type": "linear", "in": cin, "out": num_classes}]
    return _spec([in_channels, length], num_classes, layers, "cnn1d")


def flanc_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int | Sequence[int] = 28,
              width: float = 1.0, norm: str | None = None) -> dict:
    """The Fashion-MNIST CNN of FLANC's paper (the official ``cnn_flanc.py``), as dense layers.

    A 3x3 head conv ``in -> 64`` (with bias, never scaled, no activation after it, as in the
    official code), then two 3x3 convs of ``128·width`` channels without bias, each followed
    by [norm], ReLU and a 2x2 max-pool (28 -> 14 -> 7), then flatten + linear. No norm layers
    by default, as the paper. Parameters at width 0.25 / 0.5 / 0.75 / 1: 43,978 / 105,738 /
    185,930 / 284,554 (the paper's communication column: 43K / 106K / 186K / 285K).
    FLANC composes both 128-channel convs (:func:`edge_sdk.models.flanc_zoo.flanc_specs`).
    """
    h, w = _hw(image_size)
    c = scale_width(128, width)
    layers: list[dict] = [{"type": "conv2d", "in": in_channels, "out": 64, "kernel": 3, "stride": 1,
                           "padding": 1, "bias": True}]
    cin = 64
    for _ in range(2):
        layers += [{"type": "conv2d", "in": cin, "out": c, "kernel": 3, "stride": 1, "padding": 1,
                    "bias": False}] + _norm(norm, c) + [{"type": "relu"}, {"type": "maxpool2d", "kernel": 2}]
        h, w, cin = h // 2, w // 2, c
    layers += [{"type": "flatten"}, {"type": "linear", "in": cin * h * w, "out": num_classes}]
    return _spec([in_channels, *_hw(image_size)], num_classes, layers, "flanc_cnn")


def resnet_small(in_channels: int = 3, num_classes: int = 10,
                 image_size: int | Sequence[int] = 32, width: float = 1.0,
                 norm: str | None = "groupnorm", channels: Sequence[int] = (16, 32, 64),
                 blocks: int = 1) -> dict:
    """A small ResNet for 32x32 inputs (ResNet-8 with the defaults).

    3x3 stem conv, then one stage per entry of ``channels`` with ``blocks`` basic
    blocks each (the first block of every stage after the first has stride 2 and a
    1x1 projection shortcut), global average pool and a linear classifier. A basic
    block is ``residual(body=[conv, norm, relu, conv, norm], shortcut) + relu``.
    GroupNorm is the default because BatchNorm statistics suffer under non-IID FL.
    """
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 1 <= blocks <= 8:
        raise ValueError(f"blocks must be an int in [1, 8], got {blocks!r}")
    widths = _channels(channels, width)
    layers = _conv(in_channels, widths[0], 3, 1, norm) + [{"type": "relu"}]
    cin = widths[0]
    for stage, c in enumerate(widths):
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            body = _conv(cin, c, 3, stride, norm) + [{"type": "relu"}] + _conv(c, c, 3, 1, norm)
            shortcut = [] if stride == 1 and cin == c else _conv(cin, c, 1, stride, norm)
            layers += [{"type": "residual", "body": body, "shortcut": shortcut}, {"type": "relu"}]
            cin = c
    layers += [{"type": "global_avgpool"}, {"type": "linear", "in": cin, "out": num_classes}]
    return _spec([in_channels, *_hw(image_size)], num_classes, layers, "resnet_small")


def mlp(in_features: int, num_classes: int, hidden: Sequence[int] = (200, 200),
        width: float = 1.0, input_shape: Sequence[int] | None = None) -> dict:
    """Flatten, then ``linear + relu`` per hidden size, then a linear classifier.

    ``input_shape`` (default ``[in_features]``) lets the MLP take images directly;
    its product must equal ``in_features``.
    """
    shape = list(input_shape) if input_shape is not None else [in_features]
    if math.prod(shape) != in_features:
        raise ValueError(f"input_shape {shape} does not have {in_features} features")
    layers: list[dict] = [{"type": "flatten"}]
    cin = in_features
    for c in (_channels(hidden, width) if hidden else []):
        layers += [{"type": "linear", "in": cin, "out": c}, {"type": "relu"}]
        cin = c
    layers.append({"type": "linear", "in": cin, "out": num_classes})
    return _spec(shape, num_classes, layers, "mlp")


def minirocket(in_channels: int = 1, num_classes: int = 10, length: int = 300, width: float = 1.0,
               features: int = 9_996, seed: int = 0, series_norm: bool = False, norm: str | None = None) -> dict:
    """MiniRocket's fixed features of a series ``(C, L)`` (`edge_sdk.models.minirocket`: about
    ``features``) and a linear classifier, the only part that trains. A narrower ``width`` keeps
    ``ceil(84 * width)`` of the 84 kernels: its features are a prefix of the full width's, and its
    classifier's columns a prefix of the full classifier's (HeteroFL's slicing). The features'
    biases are fitted once before the first round from the fleet's statistics
    (`coordinator.runtime.series_features`) and travel with the model's state. ``norm``
    ``"batchnorm"``: batch norm over the features before the classifier (their scale standardised,
    as sktime's MiniRocket pipelines scale them before the ridge classifier); None: none."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 9:
        raise ValueError(f"minirocket needs series of at least 9 values, got length {length!r}")
    if norm not in (None, "batchnorm"):
        raise ValueError(f"minirocket's norm is batchnorm (over its features) or none, got {norm!r}")
    kernels = scale_width(NUM_KERNELS, width)
    if kernels > NUM_KERNELS:
        raise ValueError(f"minirocket's width is at most 1 (its 84 kernels), got {width!r}")
    rocket = {"type": "minirocket", "in": in_channels, "length": length, "features": features, "seed": seed,
              "series_norm": series_norm, "kernels": kernels}
    plan = MiniRocketPlan(in_channels, length, features, seed=seed, kernels=kernels)
    width_in = plan.features + (in_channels if series_norm else 0)
    head = {"type": "linear", "in": width_in, "out": num_classes}
    scaled = [{"type": "batchnorm1d", "channels": width_in}] if norm == "batchnorm" else []
    return _spec([in_channels, length], num_classes, [rocket, *scaled, head], "minirocket")


MODEL_FAMILIES: dict[str, Callable[..., dict]] = {
    "cnn4": cnn4, "cnn1d": cnn1d, "flanc_cnn": flanc_cnn, "resnet_small": resnet_small, "mlp": mlp,
    "minirocket": minirocket}


def model_for_dataset(family: str, input_shape: Sequence[int], num_classes: int,
                      width: float = 1.0, **kw: Any) -> dict:
    """Spec of ``family`` for samples of ``input_shape`` (``(C, H, W)``, ``(C, L)`` or ``(F,)``); ``spec:FILE``:
    the user's own spec file, as written (:mod:`edge_sdk.models.spec_file`)."""
    if is_spec_file(family):
        if width != 1.0 or kw:
            raise ValueError(f"{family}: a model spec file is used as written; width and "
                             f"{', '.join(sorted(kw)) or 'other'} options do not apply to it")
        return load_spec_file(family, input_shape, num_classes)
    if family not in MODEL_FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose from {sorted(MODEL_FAMILIES)}")
    shape = tuple(int(d) for d in input_shape)
    if family == "mlp":
        return mlp(math.prod(shape), num_classes, width=width, input_shape=shape, **kw)
    if family in ("cnn1d", "minirocket"):
        if len(shape) != 2:
            raise ValueError(f"{family} needs a (C, L) series input shape, got {shape}; for images use cnn4")
        return MODEL_FAMILIES[family](in_channels=shape[0], num_classes=num_classes, length=shape[1], width=width,
                                      **kw)
    if len(shape) != 3:
        hint = "; for a (C, L) series use cnn1d" if len(shape) == 2 else ""
        raise ValueError(f"{family} needs a (C, H, W) input shape, got {shape}{hint}")
    return MODEL_FAMILIES[family](in_channels=shape[0], num_classes=num_classes,
                                  image_size=shape[1:], width=width, **kw)
