"""Every method reads `--option` the same way: one boolean and number syntax, unknown keys named."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from coordinator.options import Option, Schema, boolean, choice, integer, number, option_pairs
from coordinator.aggregate.robust import RobustConfig
from coordinator.strategies import STRATEGIES, create_strategy
from coordinator.strategies.fdnnc import FdnncOptions
from coordinator.strategies.fedpara_options import FedParaOptions
from coordinator.strategies.flanc import FlancOptions
from coordinator.strategies.heterofl import HeteroFLOptions
from coordinator.strategies.reft import ReftOptions
from coordinator.strategies.base import FederationConfig, StrategyContext


@pytest.mark.parametrize("text, value", [("true", True), ("Yes", True), ("ON", True), ("1", True),
                                         ("false", False), ("no", False), ("Off", False), ("0", False)])
def test_booleans_read_alike(text, value) -> None:
    assert boolean("k", text) is value


def test_option_pairs_split_at_the_first_equals_sign_and_reject_pairs_without_a_key() -> None:
    assert option_pairs([" mu = 0.1", "levels=0.9,0.5", "note=a=b", "empty="]) == {
        "mu": "0.1", "levels": "0.9,0.5", "note": "a=b", "empty": ""}
    for bad in ("mu", "=0.1", " =1"):
        with pytest.raises(ValueError, match=re.escape(f"--option takes KEY=VALUE, got {bad!r}")):
            option_pairs([bad])


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
        Schema(Option("k", boolean, "false", "a flag")).parse("m", {"x": "1"})


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


def _accepted(name: str) -> set[str]:
    """The keys a method's error message lists as known."""
    ctx = StrategyContext(FederationConfig(), "mlp", (1, 8, 8), 10, options={"colour": "red"})
    with pytest.raises(ValueError) as info:
        create_strategy(name, ctx)
    return set(ast.literal_eval(str(info.value).split("known: ", 1)[1]))


def _page(name: str) -> str:
    cls = STRATEGIES[name]
    return cls.doc_page or cls.name


def _documented(page: str) -> set[str]:
    text = (Path(__file__).parents[1] / "docs" / "methods" / f"{page}.md").read_text()
    table = text.split("## Options", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {key for row in rows for key in re.findall(r"`([a-z][a-z_0-9]*)`", row)}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_schema_is_what_the_method_accepts(name) -> None:
    assert set(STRATEGIES[name].option_schema.keys) == _accepted(name)


def test_every_method_is_documented_with_exactly_its_options() -> None:
    pages = {_page(name) for name in STRATEGIES}
    assert pages == {p.stem for p in (Path(__file__).parents[1] / "docs" / "methods").glob("*.md")} - {"adding-a-method"}
    for page in pages:
        schemas = [set(cls.option_schema.keys) for cls in STRATEGIES.values() if _page(cls.name) == page]
        documented = _documented(page)
        for keys in schemas:
            assert keys <= documented, (page, keys - documented)
        assert documented <= set().union(*schemas), (page, documented - set().union(*schemas))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_printed_default_means_leaving_the_key_out(name) -> None:
    cls = STRATEGIES[name]
    plain = cls.parse_options({})
    literal = [row for row in cls.option_schema if row.default is not None]
    assert literal, name
    for row in literal:
        assert cls.parse_options({row.key: row.default}) == plain, (name, row.key, row.default)


def test_a_wrong_default_would_be_caught() -> None:
    """The check above is not vacuous: options differ when a value differs from the default."""
    assert STRATEGIES["flanc"].parse_options({"orth_lambda": "0.02"}) != STRATEGIES["flanc"].parse_options({})
    assert STRATEGIES["fedavg"].parse_options({"trim": "0.2"}) != STRATEGIES["fedavg"].parse_options({})


def test_option_help_prints_every_key_with_its_default(capsys) -> None:
    from edge_sdk.cli import main

    assert main(["simulate", "--method", "fdnnc", "--option", "help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fdnnc options (--option KEY=VALUE; docs/methods/fdnnc.md):")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert rows == {row.key: row.default or "-" for row in STRATEGIES["fdnnc"].option_schema}
    assert rows["rank"] == "32" and rows["upload"] == "half" and rows["big_fraction"] == "-"


def test_documented_defaults_are_the_schemas() -> None:
    """Each docs/methods table row lists its keys' defaults in order; literal ones must parse to the
    schema's default (``—``, "the family's" and the like stand for defaults that are not one value)."""
    checked = 0
    for cls in STRATEGIES.values():
        table = (Path(__file__).parents[1] / "docs" / "methods" / f"{_page(cls.name)}.md").read_text()
        table = table.split("## Options", 1)[1].split("\n## ", 1)[0]
        for line in (row for row in table.splitlines() if row.startswith("| `")):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            keys = re.findall(r"`([a-z][a-z_0-9]*)`", cells[0])
            defaults = [d.strip() for d in cells[1].split(", ")]
            assert len(defaults) == len(keys), (cls.name, keys, defaults)
            for key, text in zip(keys, defaults):
                row = cls.option_schema[key] if key in cls.option_schema else None
                if row is None or not row.default:
                    continue
                literal = text.split(" (")[0].strip("`")
                assert row.parse(key, literal) == row.parse(key, row.default), (cls.name, key, text, row.default)
                checked += 1
    assert checked > 60
