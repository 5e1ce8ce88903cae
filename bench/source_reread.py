"""Re-reading a device's SQLite source (issue 38, part 3): the client reads its data source again
at the start of every round it trains, so a re-read must be cheap.

Creates a table of ROWS rows (an integer timestamp, FEATURES float features, a string label) in a
temporary folder, reads it once, then times REPEATS re-reads and prints the median; the same rows
as a CSV file (with its `ts` key column), parsed in full each time (as after every append):

    OMP_NUM_THREADS=1 python bench/source_reread.py [--rows 100000] [--features 10] [--repeats 5]

Target (BENCHMARKS.md): 100,000 SQLite rows of 10 features in at most 1 s.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_sdk.sources import Columns, CsvSource, ReadOptions, SqliteSource


def make_db(path: Path, rows: int, features: int, seed: int = 0) -> str:
    """A readings table like a home sensor log; returns the query that reads it."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(rows, features))
    names = [f"f{i}" for i in range(features)]
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE readings (ts INTEGER PRIMARY KEY, {', '.join(n + ' REAL' for n in names)}, "
                   "label TEXT)")
        marks = ", ".join("?" * (features + 2))
        db.executemany(f"INSERT INTO readings VALUES ({marks})",
                       ((1_700_000_000 + i, *map(float, values[i]), ("off", "on")[int(values[i, 0] > 0)])
                        for i in range(rows)))
    return f"SELECT ts, {', '.join(names)}, label FROM readings"


def make_csv(db: Path, query: str, path: Path) -> None:
    """The query's rows as a CSV file with a header."""
    with sqlite3.connect(db) as connection:
        cursor = connection.execute(query)
        names = [d[0] for d in cursor.description]
        with open(path, "w") as fh:
            fh.write(",".join(names) + "\n")
            fh.writelines(",".join(map(str, row)) + "\n" for row in cursor)
    connection.close()


def _median_seconds(read, repeats: int) -> tuple[float, float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sensors.sqlite"
        query = make_db(path, args.rows, args.features)
        options = ReadOptions(classes=("off", "on"))
        source = SqliteSource(path, query, options=options)
        assert len(source.read().data) == args.rows  # the first read warms the page cache, as later rounds find it
        median, low, high = _median_seconds(source.read, args.repeats)
        print(f"sqlite re-read of {args.rows} rows x {args.features} features: median {median:.3f} s "
              f"(min {low:.3f}, max {high:.3f}, {args.repeats} re-reads)")
        csv = Path(tmp) / "sensors.csv"
        make_csv(path, query, csv)
        assert len(CsvSource(csv, Columns(key="ts"), options).read().data) == args.rows
        median, low, high = _median_seconds(lambda: CsvSource(csv, Columns(key="ts"), options).read(), args.repeats)
        print(f"csv full parse of the same rows: median {median:.3f} s (min {low:.3f}, max {high:.3f}; an unchanged "
              "file is not parsed again)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
