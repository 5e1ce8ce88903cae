"""Every method reads `--option` the same way: one boolean and number syntax, unknown keys named."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from coordinator.options import boolean, choice, integer, number, parse_keys
from coordinator.robust import RobustConfig
from coordinator.strategies import STRATEGIES, create_strategy
from coordinator.strategies.fdnnc import FdnncOptions
from coordinator.strategies.fedpara_options import FedParaOptions
from coordinator.strategies.flanc import FlancOptions
from coordinator.strategies.heterofl import HeteroFLOptions
from coordinator.strategies.reft import ReftOptions
from coordinator.strategy import FederationConfig, StrategyContext


@pytest.mark.parametrize("text, value", [("true", True), ("Yes", True), ("ON", True), ("1", True),
                                         ("false", False), ("no", False), ("Off", False), ("0", False)])
def test_booleans_read_alike(text, value) -> None:
    assert boolean("k", text) is value


def test_bad_values_are_one_line_errors_that_name_the_option() -> None:
    for parser, text, message in [(boolean, "maybe", "option k: expected true|false, got 'maybe'"),
                                  (number(0, 1), "nan", "option k: must be in [0, 1], got 'nan'"),
                                  (number(0, 0.5, open_hi=True), "0.5", "option k: must be in [0, 0.5), got '0.5'"),
                                  (integer(1), "0", "option k: must be >= 1, got 0"),
                                  (choice("a", "b"), "c", "option k: must be one of a|b, got 'c'")]:
        with pytest.raises(ValueError) as info:
            parser("k", text)
        assert str(info.value) == message
    with pytest.raises(ValueError, match=r"^m: unknown option\(s\) \['x'\]; known: \['k'\]$"):
        parse_keys("m", {"x": "1"}, {"k": boolean})


def test_every_methods_flags_take_the_same_spellings() -> None:
    assert HeteroFLOptions.from_options({"static_bn": "yes"}).static_bn is True
    assert ReftOptions.from_options({"oneshot": "yes"}).oneshot is True
    assert FdnncOptions.from_options({"freeze": "True"}).freeze is True
    assert FlancOptions.from_options({"static_bn": "No", "dynamic": "on"}).width.assignment.dynamic is True
    assert FedParaOptions.from_options({"tanh": "off"}).tanh is False
    assert FlancOptions.from_options({"precompose": "auto"}).precompose is None
    assert FlancOptions.from_options({"precompose": "yes"}).precompose is True
    assert RobustConfig.from_options({"trim": "0.2", "clip": "auto"}, "fedavg") == RobustConfig(trim=0.2, clip="auto")
    with pytest.raises(ValueError, match=r"fedavg: option trim: must be in \[0, 0.5\)"):
        RobustConfig.from_options({"trim": "0.5"}, "fedavg")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_method_names_an_unknown_key_and_what_it_knows(name) -> None:
    ctx = StrategyContext(FederationConfig(), "mlp", (1, 8, 8), 10, options={"colour": "red"})
    with pytest.raises(ValueError, match=rf"^{name}: unknown option\(s\) \['colour'\]; known: \[.*'aggregate'"):
        create_strategy(name, ctx)


#: Where each method's options are documented (lowrank and pFedPara share FedPara's page).
DOCS = {"fedavg": "fedavg", "flanc": "flanc", "heterofl": "heterofl", "fdnnc": "fdnnc", "fedpara": "fedpara",
        "pfedpara": "fedpara", "lowrank": "fedpara", "reft": "reft", "static-prune": "static-prune"}


def _accepted(name: str) -> set[str]:
    ctx = StrategyContext(FederationConfig(), "mlp", (1, 8, 8), 10, options={"colour": "red"})
    with pytest.raises(ValueError) as info:
        create_strategy(name, ctx)
    return set(ast.literal_eval(str(info.value).split("known: ", 1)[1]))


def _documented(page: str) -> set[str]:
    text = (Path(__file__).parents[1] / "docs" / "methods" / f"{page}.md").read_text()
    table = text.split("## Options", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {key for row in rows for key in re.findall(r"`([a-z_]+)`", row)}


def test_every_method_is_documented_with_exactly_its_options() -> None:
    assert set(DOCS) == set(STRATEGIES)
    for page in set(DOCS.values()):
        methods = [m for m, p in DOCS.items() if p == page]
        documented = _documented(page)
        for method in methods:
            assert _accepted(method) <= documented, (method, _accepted(method) - documented)
        assert documented <= set().union(*(_accepted(m) for m in methods)), (page, documented)
