"""``python -m edge_sdk.methods.settings``: the docs' options tables from the settings dataclasses.

``--markdown METHOD`` prints the table of METHOD's page; ``--write-docs`` rewrites the tables of
docs/methods/*.md; ``--check-docs`` exits 1 naming the pages whose table differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge_sdk.methods.registry import METHODS, find_method
from edge_sdk.methods.settings.docs import doc_table, docs_tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_sdk.methods.settings", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", metavar="METHOD", choices=sorted(METHODS), help="print METHOD's docs table")
    what.add_argument("--write-docs", action="store_true", help="rewrite the tables in docs/methods/")
    what.add_argument("--check-docs", action="store_true", help="exit 1 when a table in docs/methods/ differs")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[3],
                        help="the repository (default: this checkout)")
    args = parser.parse_args(argv)
    if args.markdown:
        print(doc_table(find_method(args.markdown).doc_page))
        return 0
    stale = docs_tables(args.root, write=args.write_docs)
    for page in stale:
        print(f"{'rewrote' if args.write_docs else 'stale'}: {page}")
    return 1 if stale and args.check_docs else 0


if __name__ == "__main__":
    sys.exit(main())
