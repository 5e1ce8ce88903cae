"""Every method reads `--option` the same way: one boolean and number syntax, unknown keys named;
its settings are one dataclass that the options schema, `--option help`, the docs table and the
device's reading of a plan all come from."""

from __future__ import annotations

import ast
import re

import pytest

from dataclasses import dataclass, replace
from unittest.mock import patch

from coordinator.strategies import STRATEGIES, create_strategy
from edge_sdk.methods import DEVICE_METHODS
from edge_sdk.methods.registry import METHODS
from edge_sdk.methods.settings.docs import doc_table, docs_tables
from edge_sdk.methods.settings.fdnnc import FdnncSettings
from edge_sdk.methods.settings.fedpara import FedParaSettings
from edge_sdk.methods.settings.flanc import FlancSettings
from edge_sdk.methods.settings.heterofl import HeteroFLSettings
from edge_sdk.methods.settings.options import (boolean, choice, from_wire, integer, number, option, option_pairs,
                                               parse, schema, to_wire)
from edge_sdk.methods.settings.reft import ReftSettings
from edge_sdk.methods.settings.shared import RobustConfig
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from tests.support.paths import REPO_ROOT


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
        parse(_Flag, "m", {"x": "1"})


@dataclass(frozen=True)
class _Flag:
    k: bool = option(False, boolean, "a flag")


def test_every_methods_flags_take_the_same_spellings() -> None:
    assert parse(HeteroFLSettings, "heterofl", {"static_bn": "yes"}).static_bn is True
    assert parse(ReftSettings, "reft", {"oneshot": "yes"}).oneshot is True
    assert parse(FdnncSettings, "fdnnc", {"freeze": "True"}).freeze is True
    assert parse(FlancSettings, "flanc", {"static_bn": "No", "dynamic": "on"}).width.assignment.dynamic is True
    assert parse(FedParaSettings, "fedpara", {"tanh": "off"}).tanh is False
    assert parse(FlancSettings, "flanc", {"precompose": "auto"}).precompose is None
    assert parse(FlancSettings, "flanc", {"precompose": "yes"}).precompose is True
    assert parse(RobustConfig, "fedavg", {"trim": "0.2", "clip": "auto"}) == RobustConfig(trim=0.2, clip="auto")
    with pytest.raises(ValueError, match=r"fedavg: option trim: must be in \[0, 0.5\)"):
        parse(RobustConfig, "fedavg", {"trim": "0.5"})


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
    return METHODS[name].doc_page


def _schema(name: str):
    return schema(STRATEGIES[name].settings_type)


def _documented(page: str) -> set[str]:
    text = (REPO_ROOT / "docs" / "methods" / f"{page}.md").read_text()
    table = text.split("## Options", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {key for row in rows for key in re.findall(r"`([a-z][a-z_0-9]*)`", row)}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_schema_is_what_the_method_accepts(name) -> None:
    assert set(_schema(name).keys) == _accepted(name)


def test_every_method_is_documented_with_exactly_its_options() -> None:
    pages = {_page(name) for name in STRATEGIES}
    assert pages == {p.stem for p in (REPO_ROOT / "docs" / "methods").glob("*.md")} - {"adding-a-method"}
    for page in pages:
        schemas = [set(_schema(name).keys) for name in STRATEGIES if _page(name) == page]
        documented = _documented(page)
        for keys in schemas:
            assert keys <= documented, (page, keys - documented)
        assert documented <= set().union(*schemas), (page, documented - set().union(*schemas))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_printed_default_means_leaving_the_key_out(name) -> None:
    cls = STRATEGIES[name]
    plain = cls.parse_options({})
    literal = [row for row in _schema(name) if row.default is not None]
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
    assert rows == {row.key: row.default or "-" for row in _schema("fdnnc")}
    assert rows["rank"] == "32" and rows["upload"] == "half" and rows["big_fraction"] == "-"


def test_documented_defaults_are_the_schemas() -> None:
    """Each docs/methods table row lists its keys' defaults in order; literal ones must parse to the
    schema's default (``—``, "the family's" and the like stand for defaults that are not one value)."""
    checked = 0
    for cls in STRATEGIES.values():
        table = (REPO_ROOT / "docs" / "methods" / f"{_page(cls.name)}.md").read_text()
        table = table.split("## Options", 1)[1].split("\n## ", 1)[0]
        for line in (row for row in table.splitlines() if row.startswith("| `")):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            keys = re.findall(r"`([a-z][a-z_0-9]*)`", cells[0])
            defaults = [d.strip() for d in cells[1].split(", ")]
            assert len(defaults) == len(keys), (cls.name, keys, defaults)
            for key, text in zip(keys, defaults, strict=True):
                rows = _schema(cls.name)
                row = rows[key] if key in rows else None
                if row is None or not row.default:
                    continue
                literal = text.split(" (")[0].strip("`")
                assert row.parse(key, literal) == row.parse(key, row.default), (cls.name, key, text, row.default)
                checked += 1
    assert checked > 60


def test_one_registry_holds_every_method_and_everything_else_is_read_from_it() -> None:
    """edge_sdk.methods.registry.METHODS (no torch) is the only list of methods: the coordinator's
    strategies, their settings and device parts, and the devices' parts are all read from it."""
    assert set(METHODS) == set(STRATEGIES)
    for name, cls in STRATEGIES.items():
        method = METHODS[name]
        assert f"{cls.__module__}:{cls.__qualname__}" == method.strategy and cls.name == name
        assert cls.settings_type is method.settings and cls.device_part() == method.device_part, name
        assert method.device_part in DEVICE_METHODS, name  # a device can train its plans
    assert set(DEVICE_METHODS) == {m.device_part for m in METHODS.values()}


def test_a_registry_entry_that_names_another_class_is_refused() -> None:
    from coordinator.strategies import _Strategies

    strategies = _Strategies()
    with patch.dict(METHODS, {"fedavg": replace(METHODS["fedavg"], strategy="coordinator.strategies.fedprox:FedProx")}):
        with pytest.raises(TypeError, match="is not a Strategy named 'fedavg'"):
            strategies["fedavg"]


def test_the_docs_tables_are_the_generated_ones() -> None:
    """docs/methods/*.md's options tables are `python -m edge_sdk.methods.settings --write-docs`'s."""
    assert docs_tables(REPO_ROOT) == [], "run: python -m edge_sdk.methods.settings --write-docs"
    assert "| `holdout` | 0.2 |" in doc_table("fedpara")  # the page's widest settings: pFedPara's


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_device_reads_a_plan_with_the_coordinators_defaults(name) -> None:
    """One default per setting: what the coordinator sends is what the device reads back, and a
    plan without a device setting means the coordinator's default (FLANC's static_bn: true)."""
    cls = STRATEGIES[name].settings_type
    settings = cls()
    wire = to_wire(settings)
    back, rest = from_wire(cls, name, {**wire, "lr": 0.1})
    assert back == settings and rest == {"lr": 0.1}
    assert from_wire(cls, name, {})[0] == settings
    assert from_wire(FlancSettings, "flanc", {})[0].static_bn is True
    with pytest.raises(ValueError, match=r"^flanc: static_bn must be like True, got 1$"):
        from_wire(FlancSettings, "flanc", {"static_bn": 1})
