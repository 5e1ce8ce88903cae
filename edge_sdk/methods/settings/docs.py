"""The options tables of docs/methods/*.md, generated from the methods' settings dataclasses."""

from __future__ import annotations

import re
from pathlib import Path

from edge_sdk.methods.registry import METHODS
from edge_sdk.methods.settings.options import markdown_table, schema

__all__ = ["doc_table", "docs_tables"]


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
