"""Model zoo: every family builds, shapes, parameter counts, widths, wire round trip."""
from __future__ import annotations


import msgpack
import pytest
import torch

from tests.support.run_python import run_python
from edge_sdk.models import (MODEL_FAMILIES, SpecError, build_model, cnn4, count_flops,
                             count_params, infer_shapes, mlp, model_for_dataset, resnet_small)
from edge_sdk.models.zoo import scale_width

CASES = [
    ("cnn4", (1, 28, 28), 10, {}),
    ("cnn4", (1, 8, 8), 10, {"norm": "groupnorm"}),
    ("cnn4", (3, 32, 32), 100, {"norm": "batchnorm"}),
    ("cnn4", (3, 24, 40), 7, {}),
    ("resnet_small", (3, 32, 32), 10, {}),
    ("resnet_small", (1, 28, 28), 62, {"norm": None}),
    ("resnet_small", (3, 32, 32), 10, {"norm": "batchnorm", "blocks": 2}),
    ("mlp", (1, 28, 28), 10, {}),
    ("mlp", (64,), 3, {"hidden": (32,)}),
]


@pytest.mark.parametrize("family, shape, classes, kw", CASES)
@pytest.mark.parametrize("width", [1.0, 0.25])
def test_every_family_builds_and_counts(family: str, shape: tuple, classes: int, kw: dict,
                                        width: float) -> None:
    spec = model_for_dataset(family, shape, classes, width=width, **kw)
    assert spec["input_shape"] == list(shape) and spec["num_classes"] == classes
    model = build_model(spec)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, classes)
    n = sum(p.numel() for p in model.parameters())
    assert count_params(spec) == count_params(model) == n
    assert infer_shapes(spec)[-1] == (classes,)
    assert count_flops(spec) > 0


def test_width_scales_hidden_channels_only() -> None:
    full, half = cnn4(), cnn4(width=0.5)
    convs = lambda s: [(l["in"], l["out"]) for l in s["layers"] if l["type"] == "conv2d"]
    assert convs(full) == [(1, 32), (32, 64), (64, 64), (64, 128)]
    assert convs(half) == [(1, 16), (16, 32), (32, 32), (32, 64)]
    assert half["layers"][-1] == {"type": "linear", "in": 64, "out": 10}
    assert scale_width(30, 0.1) == 3 and scale_width(32, 0.1) == 4 and scale_width(32, 0.001) == 1
    assert count_params(half) < count_params(full) / 3
    assert count_flops(half) < count_flops(full) / 3
    for bad in (0, -1.0, float("nan"), True, 17, "1"):
        with pytest.raises(ValueError):
            cnn4(width=bad)


def test_cnn4_pools_while_possible() -> None:
    assert [s for s in infer_shapes(cnn4()) if len(s) == 3][-1] == (128, 1, 1)
    shapes8 = infer_shapes(cnn4(image_size=8))
    assert (32, 4, 4) in shapes8 and (128, 1, 1) in shapes8
    pools = [l for l in cnn4(image_size=8)["layers"] if l["type"] == "maxpool2d"]
    assert len(pools) == 3  # 8 -> 4 -> 2 -> 1, the 4th conv runs at 1x1


def test_resnet_small_is_resnet8() -> None:
    spec = resnet_small()
    convs, shortcuts = 0, 0
    for layer in spec["layers"]:
        if layer["type"] == "conv2d":
            convs += 1
        if layer["type"] == "residual":
            convs += sum(l["type"] == "conv2d" for l in layer["body"])
            shortcuts += bool(layer["shortcut"])
    linears = sum(l["type"] == "linear" for l in spec["layers"])
    assert convs + linears == 8 and shortcuts == 2
    assert infer_shapes(spec)[-3:] == [(64, 8, 8), (64,), (10,)]
    odd = resnet_small(width=0.3)   # 5, 10, 20 channels: GroupNorm groups must divide them
    for layer in odd["layers"][0:2]:
        if layer["type"] == "groupnorm":
            assert layer["channels"] % layer["groups"] == 0
    build_model(odd)


def test_msgpack_round_trip_same_weights() -> None:
    for family, shape, classes, kw in CASES:
        spec = model_for_dataset(family, shape, classes, **kw)
        wire = msgpack.unpackb(msgpack.packb(spec))
        assert wire == spec
        torch.manual_seed(3)
        a = build_model(spec).state_dict()
        torch.manual_seed(3)
        b = build_model(wire).state_dict()
        assert list(a) == list(b)
        assert all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)


def test_bad_arguments() -> None:
    assert set(MODEL_FAMILIES) == {"cnn4", "cnn1d", "flanc_cnn", "resnet_small", "mlp", "minirocket"}
    with pytest.raises(ValueError, match="unknown model family"):
        model_for_dataset("vgg", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="C, H, W"):
        model_for_dataset("cnn4", (64,), 10)
    with pytest.raises(ValueError, match="norm"):
        cnn4(norm="layernorm")
    with pytest.raises(ValueError, match="does not have"):
        mlp(100, 10, input_shape=(1, 8, 8))
    with pytest.raises(SpecError):
        cnn4(num_classes=0)
    with pytest.raises(ValueError, match="blocks"):
        resnet_small(blocks=0)
    with pytest.raises(ValueError, match="channels"):
        cnn4(channels=())
    assert mlp(10, 2, hidden=())["layers"] == [{"type": "flatten"},
                                              {"type": "linear", "in": 10, "out": 2}]


def test_edge_sdk_stays_lean() -> None:
    run_python("import sys, edge_sdk.models, edge_sdk.training, edge_sdk.tensors",
               "heavy = ('coordinator', 'nni', 'onnx', 'sklearn', 'mlxtend', 'matplotlib', 'rich')",
               "bad = [m for m in heavy if m in sys.modules]",
               "assert not bad, bad", timeout=60)


def test_the_torch_free_family_names_are_the_zoos() -> None:
    from edge_sdk.model_names import MODEL_FAMILY_NAMES
    from edge_sdk.models.zoo import MODEL_FAMILIES

    assert sorted(MODEL_FAMILY_NAMES) == sorted(MODEL_FAMILIES)
