"""The SQLite data source (issue 38, part 3): one SELECT on a read-only connection, the first
column (or `key`) giving order and stable keys, bad rows counted, a broken query one line."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from edge_sdk.sources import Columns, NoData, ReadOptions, SqliteSource

QUERY = "SELECT ts, temp, humidity, label FROM readings"
CLASSES = ("off", "on")


def _db(path, rows):
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS readings (ts INTEGER, temp REAL, humidity, label)")
        db.executemany("INSERT INTO readings VALUES (?, ?, ?, ?)", rows)
    db.close()
    return path


def _rows(start, stop):
    return [(t, 20.0 + t, 40.0 + t, ("off", "on")[t % 2]) for t in range(start, stop)]


def _source(path, query=QUERY, **options):
    return SqliteSource(path, query, options=ReadOptions(classes=CLASSES, **options))


def test_the_first_column_orders_the_rows_and_is_their_key(tmp_path):
    path = _db(tmp_path / "s.db", [(5, 1.0, 2.0, "on"), (9, 3.0, 4.0, "off"), (7, 5.0, 6.0, "on")])
    read = _source(path).read()
    assert read.data.keys.tolist() == [9, 7, 5]
    assert read.data.x.tolist() == [[3.0, 4.0], [5.0, 6.0], [1.0, 2.0]]
    assert read.data.y.tolist() == [0, 1, 1] and read.data.num_classes == 2
    assert read.test is None and read.skipped == {}


def test_keys_do_not_change_as_rows_are_added_and_max_samples_keeps_the_newest(tmp_path):
    path = _db(tmp_path / "s.db", _rows(0, 50))
    source = _source(path)
    before = source.read().data
    _db(path, _rows(50, 80))
    after = source.read().data
    assert len(before) == 50 and len(after) == 80
    old = dict(zip(before.keys.tolist(), before.x[:, 0].tolist(), strict=True))
    assert all(dict(zip(after.keys.tolist(), after.x[:, 0].tolist(), strict=True))[k] == v for k, v in old.items())
    assert _source(path, max_samples=10).read().data.keys.tolist() == list(range(79, 69, -1))


def test_named_key_label_and_feature_columns(tmp_path):
    path = _db(tmp_path / "s.db", [(1, 10.0, 11.0, "on"), (2, 12.0, 13.0, "off")])
    query = "SELECT temp AS t, humidity AS h, label AS kind, ts AS rowtime FROM readings"
    source = SqliteSource(path, query, Columns(label="kind", features=("h",), key="rowtime"),
                          ReadOptions(classes=CLASSES))
    read = source.read()
    assert read.data.x.tolist() == [[13.0], [11.0]] and read.data.keys.tolist() == [2, 1]
    assert read.data.y.tolist() == [0, 1]


def test_iso_timestamp_text_keys(tmp_path):
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE log (at TEXT, v REAL, label INTEGER)")
        db.executemany("INSERT INTO log VALUES (?, ?, ?)", [("2024-01-02 10:00:00", 1.0, 0),
                                                             ("2024-01-03 09:00:00", 2.0, 1),
                                                             ("2024-01-01 23:00:00", 3.0, 0)])
    db.close()
    read = SqliteSource(path, "SELECT at, v, label FROM log").read()
    assert read.data.x[:, 0].tolist() == [2.0, 1.0, 3.0] and read.data.num_classes == 2


def test_bad_rows_are_skipped_and_counted_in_one_log_line(tmp_path, caplog):
    path = _db(tmp_path / "s.db", [(1, 1.0, 1.0, "on"), (2, None, 1.0, "on"), (3, 1.0, "wet", "off"),
                                   (4, 1.0, 1.0, "heating"), (5, 1.0, 1.0, 7), (6, 2.0, 2.0, "off")])
    with caplog.at_level(logging.WARNING, logger="edge_sdk.sources"):
        read = _source(path).read()
    assert read.data.keys.tolist() == [6, 1]
    assert read.skipped == {"NaN": 1, "not a number": 1, "label not a class": 2}
    assert [r.getMessage() for r in caplog.records if r.name == "edge_sdk.sources"] == [
        f"skipped 4 rows of {path}: 2 label not a class, 1 NaN, 1 not a number"]


@pytest.mark.parametrize("query", ["DELETE FROM readings", "DROP TABLE readings", "PRAGMA user_version = 3",
                                   "ATTACH DATABASE 'x.db' AS x", "SELECT 'unterminated", "", "   "])
def test_only_one_select_statement_is_accepted(tmp_path, query):
    with pytest.raises(ValueError, match=r"\[data\] query must be") as info:
        _source(tmp_path / "s.db", query)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("query, words", [
    ("SELECT * FROM nowhere", "no such table: nowhere"),
    ("SELECT ts, temp, humidity, label FROM readings; DELETE FROM readings", "one statement at a time"),
    ("SELECT * FROM pragma_table_info('readings')", "not authorized"),  # only SELECT, READ, FUNCTION
    ("SELECT load_extension('/tmp/x.so'), 1 AS label", "not authorized"),
])
def test_a_query_that_fails_or_tries_more_is_one_line_and_the_database_is_untouched(tmp_path, query, words):
    path = _db(tmp_path / "s.db", _rows(0, 5))
    before = path.read_bytes()
    with pytest.raises(ValueError) as info:
        _source(path, query).read()
    assert str(info.value).startswith(f"{path}: [data] query failed: ") and words in str(info.value)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM readings").fetchone() == (5,)
    db.close()


def test_a_with_query_runs(tmp_path):
    path = _db(tmp_path / "s.db", _rows(0, 6))
    query = "WITH recent AS (SELECT * FROM readings WHERE ts >= 2) SELECT ts, temp, label FROM recent"
    assert _source(path, query).read().data.keys.tolist() == [5, 4, 3, 2]


def test_a_label_in_the_first_column_needs_a_key(tmp_path):
    path = _db(tmp_path / "s.db", _rows(0, 2))
    with pytest.raises(ValueError, match=r"\[data\] key: the first column of .* is the label 'label'; put a row id"):
        _source(path, "SELECT label, temp FROM readings").read()
    read = _source(path, "SELECT rowid, label, temp FROM readings").read()
    assert read.data.keys.tolist() == [2, 1]


def test_the_connection_is_read_only(tmp_path, monkeypatch):
    path = _db(tmp_path / "s.db", _rows(0, 3))
    connections = []
    real_connect = sqlite3.connect

    def spy(*args, **kwargs):
        connections.append(args[0])
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", spy)
    assert len(_source(path).read().data) == 3
    assert connections and connections[0].startswith("file:") and connections[0].endswith("?mode=ro")


def test_a_missing_database_or_an_empty_result_is_no_data(tmp_path):
    with pytest.raises(NoData, match="does not exist"):
        _source(tmp_path / "none.db").read()
    path = _db(tmp_path / "s.db", [])
    with pytest.raises(NoData, match="has no rows"):
        _source(path).read()
    bad = tmp_path / "text.db"
    bad.write_text("not a database, just text " * 100)
    with pytest.raises(ValueError, match="query failed: file is not a database"):
        _source(bad).read()


def test_a_timestamp_not_first_without_a_key_is_one_line_naming_it(tmp_path):
    """The home user's mistake: the timestamp after a reading in the SELECT and no [data] key. The
    reading (a fraction) would be the key and the timestamp a feature: refused, the column named."""
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("CREATE TABLE readings (ts TEXT, watts REAL, label TEXT)")
        db.executemany("INSERT INTO readings VALUES (?, ?, ?)",
                       [(f"2026-11-28T10:00:{s:02d}", 230.5 + s, "on") for s in range(10)])
    db.close()
    with pytest.raises(ValueError, match=r"key column 'watts' holds fractions such as 230\.5.*\[data\] key"):
        _source(tmp_path / "s.db", "SELECT watts, ts, label FROM readings").read()
    with pytest.raises(ValueError, match=r"column 'ts' holds timestamps but is read as a feature; name it with "
                                         r"\[data\] key = 'ts'"):
        _source(tmp_path / "s.db", "SELECT rowid, watts, ts, label FROM readings").read()  # ts: a feature
    read = SqliteSource(tmp_path / "s.db", "SELECT watts, ts, label FROM readings",
                        Columns(label="label", key="ts"), ReadOptions(classes=CLASSES)).read()
    assert len(read.data) == 10  # named, the same query reads


def test_a_key_shared_by_two_rows_is_refused(tmp_path):
    path = _db(tmp_path / "s.db", [(5, 1.0, 2.0, "on"), (5, 3.0, 4.0, "off"), (7, 5.0, 6.0, "on")])
    with pytest.raises(ValueError, match=r"key column 'ts' holds 1 repeated value\(s\) \(e\.g\. 5\)"):
        _source(path).read()
