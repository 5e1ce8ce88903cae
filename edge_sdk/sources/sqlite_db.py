"""An SQLite database (where home sensor logs usually live), read through one SELECT, read-only."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from edge_sdk.sources.base import NoData, Skipped, SourceRead
from edge_sdk.sources.options import ReadOptions
from edge_sdk.sources.table import Columns, read_table

__all__ = ["MAX_QUERY", "QUERY_TIMEOUT_S", "SqliteSource", "check_query"]

#: Longest query accepted (characters).
MAX_QUERY = 10_000
#: A query running longer than this is interrupted (a one-line ValueError).
QUERY_TIMEOUT_S = 60.0
#: What the query may do: read tables and call functions, nothing else (no ATTACH, PRAGMA, writes).
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
            getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
_FIRST_WORD = re.compile(r"\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*(\w+)", re.S)


def check_query(query: object) -> str:
    """``query`` if it is one SELECT (or WITH ... SELECT) statement, else a one-line ValueError."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("[data] query must be an SQL SELECT statement, e.g. "
                         "\"SELECT ts, temp, humidity, label FROM readings\"")
    if len(query) > MAX_QUERY:
        raise ValueError(f"[data] query is longer than {MAX_QUERY} characters")
    first = _FIRST_WORD.match(query)
    if first is None or first.group(1).upper() not in ("SELECT", "WITH"):
        raise ValueError(f"[data] query must be a single SELECT statement, got {query.strip()[:40]!r}")
    body = query.strip().rstrip(";").rstrip()
    if not sqlite3.complete_statement(body + ";") or sqlite3.complete_statement(body):
        raise ValueError(f"[data] query must be a single complete SELECT statement, got {query.strip()[:40]!r}")
    return query


def _authorize(action: int, *_: object) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


class SqliteSource:
    """``sqlite = "/path/db.sqlite"`` with ``query = "SELECT ..."``: opened read-only; the result's
    columns by name: ``key`` (default: the first column; a row id or a numeric or ISO-8601
    timestamp: order, newest largest, and stable key), ``label`` (default "label"), ``features``
    (default: the rest)."""

    def __init__(self, path: str | Path, query: str, columns: Columns | None = None,
                 options: ReadOptions | None = None) -> None:
        self.path = Path(path).expanduser()
        self.query = check_query(query)
        self.columns = columns or Columns(first_is_key=True)
        self.options = options or ReadOptions()
        shown = " ".join(query.split())
        self.description = f"sqlite {self.path} ({shown[:60]}{'...' if len(shown) > 60 else ''})"

    def read(self) -> SourceRead:
        where = str(self.path)
        if not self.path.exists():
            raise NoData(f"{where} does not exist")
        if not self.path.is_file():
            raise ValueError(f"[data] sqlite {where} is not a file")
        try:
            names, rows = self._run()
        except (sqlite3.Error, sqlite3.Warning) as exc:  # Warning: a second statement (before 3.12)
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise ValueError(f"{where}: [data] query failed: {text}") from None
        skipped = Skipped()
        data = read_table(names, rows, self.columns, self.options, skipped, where)
        return SourceRead(data, None, skipped.report(where))

    def _run(self) -> tuple[list[str], list[tuple]]:
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        connection = sqlite3.connect(uri, uri=True, timeout=10.0, check_same_thread=False)
        try:
            deadline = time.monotonic() + QUERY_TIMEOUT_S
            connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 100_000)
            connection.set_authorizer(_authorize)
            cursor = connection.execute(self.query)
            if cursor.description is None:
                raise sqlite3.ProgrammingError("the query returns no columns")
            names = [str(d[0]) for d in cursor.description]
            return names, cursor.fetchall()
        finally:
            connection.close()
