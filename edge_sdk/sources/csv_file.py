"""A CSV file with a header row: feature columns, a label column, optionally a key column."""

from __future__ import annotations

import csv
from pathlib import Path

from edge_sdk.sources.assemble import WRONG_SHAPE
from edge_sdk.sources.base import NoData, Skipped, SourceRead
from edge_sdk.sources.keys import hash_texts
from edge_sdk.sources.options import ReadOptions
from edge_sdk.sources.table import Columns, read_table

__all__ = ["MAX_COLUMNS", "CsvSource"]

#: Most columns a CSV header may name (a cell is at most the csv module's 131,072 characters).
MAX_COLUMNS = 65_536


class CsvSource:
    """``csv = "/path/file.csv"``: the header names the columns; ``label`` (default "label"),
    ``features`` (default: every other column but the key), ``key`` (a numeric or ISO-8601 row id or
    timestamp: order and stable key; without it, the last row is the newest and a row's key is the
    hash of its text). Read in full each time; an unchanged file is not parsed again."""

    def __init__(self, path: str | Path, columns: Columns | None = None,
                 options: ReadOptions | None = None) -> None:
        self.path = Path(path).expanduser()
        self.columns = columns = columns or Columns()
        self.options = options or ReadOptions()
        key = f", key column {columns.key!r}" if columns.key else ""
        self.description = f"csv {self.path} (label column {columns.label!r}{key})"
        self._cache: tuple[tuple[int, int, int], SourceRead] | None = None

    def read(self) -> SourceRead:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            raise NoData(f"{self.path} does not exist") from None
        except OSError as exc:
            raise ValueError(f"{self.path}: {exc.strerror or exc}") from None
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._cache is None or self._cache[0] != signature:
            self._cache = (signature, self._parse())
        read = self._cache[1]
        return SourceRead(read.data, None, Skipped(read.skipped).report(str(self.path)))

    def _parse(self) -> SourceRead:
        where = str(self.path)
        try:
            with open(self.path, newline="", encoding="utf-8-sig") as fh:
                reader = csv.reader(fh)
                header = next((row for row in reader if row), None)  # blank lines are no rows
                if header is None:
                    raise NoData(f"{where} is empty")
                names = [n.strip() for n in header]
                if len(names) > MAX_COLUMNS or len(set(names)) != len(names):
                    raise ValueError(f"{where}: the header must name at most {MAX_COLUMNS} distinct columns")
                rows = [row for row in reader if row]
        except csv.Error as exc:
            raise ValueError(f"{where}: line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except IsADirectoryError:
            raise ValueError(f"[data] csv {where} is a folder, not a file") from None
        except FileNotFoundError:
            raise NoData(f"{where} does not exist") from None
        except OSError as exc:
            raise ValueError(f"{where}: {exc.strerror or exc}") from None
        skipped = Skipped()
        good = [row for row in rows if len(row) == len(names)]
        if len(good) != len(rows):
            skipped[WRONG_SHAPE] += len(rows) - len(good)
        keys = hash_texts(good) if self.columns.key is None else None
        data = read_table(names, good, self.columns, self.options, skipped, where, row_keys=keys)
        return SourceRead(data, None, dict(skipped))
