"""Every method's settings, one frozen dataclass each, and the registry of method names, without torch.

A method's settings dataclass is defined here, beside its device half (:mod:`edge_sdk.methods`),
and imported by its coordinator half (:mod:`coordinator.strategies`): one default, one type and one
line of help per setting (:func:`edge_sdk.methods.settings.options.option`). The ``--option``
schema, ``edgefl simulate --method M --option help``, the report's ``method_config``, the device's
reading of ``plan.train`` and the docs' options tables are all derived from it.

``python -m edge_sdk.methods.settings --markdown METHOD`` prints a method's docs table;
``--write-docs`` rewrites the tables in docs/methods/, ``--check-docs`` fails when one differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edge_sdk.methods.settings.fdnnc import FdnncSettings
from edge_sdk.methods.settings.fedavg import FedAvgSettings
from edge_sdk.methods.settings.fedpara import FedParaSettings, LowRankSettings, PFedParaSettings
from edge_sdk.methods.settings.fedprox import FedProxSettings
from edge_sdk.methods.settings.flanc import FlancSettings
from edge_sdk.methods.settings.heterofl import HeteroFLSettings
from edge_sdk.methods.settings.options import help_text, markdown_table, parse, schema
from edge_sdk.methods.settings.reft import ReftSettings
from edge_sdk.methods.settings.static_prune import StaticPruneSettings

__all__ = ["MethodSettings", "METHODS", "method_settings", "doc_table", "docs_tables"]


@dataclass(frozen=True)
class MethodSettings:
    """A method's name, its settings dataclass and the docs page that explains them."""

    name: str
    settings: type
    doc_page: str

    @property
    def doc_path(self) -> str:
        """The page, relative to the repository: ``docs/methods/<page>.md``."""
        return f"docs/methods/{self.doc_page}.md"

    def help(self) -> str:
        """The table ``--option help`` prints."""
        return help_text(self.settings, self.name, self.doc_path)

    def parse(self, options: Mapping[str, Any]) -> Any:
        """The settings from ``--option`` text (one-line ValueError naming the method)."""
        return parse(self.settings, self.name, options)


#: Every method, by the name ``--method`` and a plan's ``method`` use.
METHODS: dict[str, MethodSettings] = {m.name: m for m in (
    MethodSettings("fedavg", FedAvgSettings, "fedavg"),
    MethodSettings("fedprox", FedProxSettings, "fedprox"),
    MethodSettings("flanc", FlancSettings, "flanc"),
    MethodSettings("heterofl", HeteroFLSettings, "heterofl"),
    MethodSettings("fdnnc", FdnncSettings, "fdnnc"),
    MethodSettings("fedpara", FedParaSettings, "fedpara"),
    MethodSettings("pfedpara", PFedParaSettings, "fedpara"),
    MethodSettings("lowrank", LowRankSettings, "fedpara"),
    MethodSettings("reft", ReftSettings, "reft"),
    MethodSettings("static-prune", StaticPruneSettings, "static-prune"),
)}


def method_settings(name: str) -> MethodSettings:
    """The method ``name``; ValueError lists the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None


def doc_table(page: str) -> str:
    """The options table of docs/methods/``page``.md: of the method on that page whose keys include
    every other's there (FedPara's page: pFedPara's, which adds ``holdout`` to FedPara's)."""
    methods = [m for m in METHODS.values() if m.doc_page == page]
    if not methods:
        pages = sorted({m.doc_page for m in METHODS.values()})
        raise ValueError(f"no method is documented on {page!r}; pages: {pages}")
    union = set().union(*(schema(m.settings).keys for m in methods))
    widest = [m for m in methods if set(schema(m.settings).keys) == union]
    if not widest:
        raise ValueError(f"no method on {page!r} takes every key documented there")
    return markdown_table(widest[0].settings)


_TABLE = re.compile(r"(^## Options[^\n]*\n(?:(?!\|)[^\n]*\n)*?)((?:\|[^\n]*\n)+)", re.MULTILINE)


def docs_tables(root: Path, *, write: bool = False) -> list[str]:
    """The pages under ``root``/docs/methods whose ``## Options`` table is not the generated one
    (rewritten when ``write``)."""
    stale = []
    for page in sorted({m.doc_page for m in METHODS.values()}):
        path = root / "docs" / "methods" / f"{page}.md"
        current = path.read_text()
        match = _TABLE.search(current)
        if match is None:
            raise ValueError(f"{path}: no table under a '## Options' heading")
        wanted = current[:match.start(2)] + doc_table(page) + "\n" + current[match.end(2):]
        if wanted != current:
            stale.append(str(path.relative_to(root)))
            if write:
                path.write_text(wanted)
    return stale
