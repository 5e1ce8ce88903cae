"""Your own model as a spec file (JSON or TOML): validated as untrusted input, of the job's task,
taken by the methods that can compress it and refused in one line by the others."""

from __future__ import annotations

import json

import pytest

from coordinator.core.federation import FederationConfig
from coordinator.strategies import STRATEGIES, create_strategy
from coordinator.strategies.base import StrategyContext
from edge_sdk.models.spec_file import load_spec_file
from edge_sdk.models.zoo import model_for_dataset

SPEC = {"format": 1, "input_shape": [1, 8, 8], "num_classes": 10,
        "layers": [{"type": "conv2d", "in": 1, "out": 8, "kernel": 3, "padding": 1}, {"type": "relu"},
                   {"type": "flatten"}, {"type": "linear", "in": 512, "out": 10}]}
TOML = """format = 1
input_shape = [1, 8, 8]
num_classes = 10
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
in = 64
out = 10
"""


def test_a_json_or_toml_spec_file_is_the_model_as_written(tmp_path) -> None:
    (tmp_path / "conv.json").write_text(json.dumps(SPEC))
    (tmp_path / "linear.toml").write_text(TOML)
    assert model_for_dataset(f"spec:{tmp_path / 'conv.json'}", (1, 8, 8), 10) == SPEC
    assert model_for_dataset(f"spec:{tmp_path / 'linear.toml'}", (1, 8, 8), 10)["layers"][1]["out"] == 10


@pytest.mark.parametrize("name, text, words", [
    ("missing.json", None, "No such file or directory"),
    ("model.yaml", "{}", "must end in .json or .toml"),
    ("broken.json", "{", "Expecting property name"),
    ("unknown.json", json.dumps({**SPEC, "layers": [{"type": "transformer"}]}), "transformer"),
    ("chain.json", json.dumps({**SPEC, "layers": [{"type": "flatten"}, {"type": "linear", "in": 63, "out": 10}]}),
     "63"),
    ("shape.json", json.dumps({**SPEC, "input_shape": [3, 8, 8],
                               "layers": [{"type": "flatten"}, {"type": "linear", "in": 192, "out": 10}]}),
     "input_shape (3, 8, 8) is not the task's (1, 8, 8)"),
    ("classes.json", json.dumps({**SPEC, "num_classes": 4,
                                 "layers": [{"type": "flatten"}, {"type": "linear", "in": 64, "out": 4}]}),
     "num_classes 4 is not the task's 10"),
])
def test_a_bad_spec_file_is_one_line_naming_the_file(tmp_path, name, text, words) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_spec_file(f"spec:{path}", (1, 8, 8), 10)
    message = str(err.value)
    assert message.startswith(f"model spec file {path}: ") and words in message and "\n" not in message, message


def test_a_spec_file_is_used_as_written_not_resized(tmp_path) -> None:
    (tmp_path / "conv.json").write_text(json.dumps(SPEC))
    with pytest.raises(ValueError, match="used as written; width and norm options do not apply"):
        create_strategy("fedavg", StrategyContext(FederationConfig(), f"spec:{tmp_path / 'conv.json'}", (1, 8, 8), 10,
                                                  options={"width": "0.5", "norm": "batchnorm"}))


def test_each_method_takes_a_spec_file_or_refuses_it_in_one_line(tmp_path) -> None:
    (tmp_path / "conv.json").write_text(json.dumps(SPEC))
    family = f"spec:{tmp_path / 'conv.json'}"
    takers = sorted(name for name, cls in STRATEGIES.items() if cls.spec_file_support)
    assert takers == ["fedavg", "fedprox", "reft", "static-prune"]
    for name in ("fedavg", "fedprox"):
        strategy = create_strategy(name, StrategyContext(FederationConfig(), family, (1, 8, 8), 10))
        assert strategy.model_spec == SPEC
    for name in sorted(set(STRATEGIES) - set(takers)):
        with pytest.raises(ValueError) as err:
            create_strategy(name, StrategyContext(FederationConfig(), family, (1, 8, 8), 10))
        assert str(err.value).startswith(f"{name} composes its networks from a model family")
        assert "with a spec file use fedavg, fedprox, reft, static-prune" in str(err.value)
