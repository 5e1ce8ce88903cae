"""Where a device's data comes from, read again at the start of every round it trains.

Each source returns every valid sample newest first (at most ``max_samples``), with one stable
key per sample (a row id or timestamp column, else a hash of the sample) so the federated-evaluation
holdout does not move as the data grows. Bad rows are skipped and counted in one log line; a
missing or empty source raises NoData; anything else wrong is a one-line ValueError. The client TOML's
``[data]`` table names one (edge_sdk.sources.from_toml.data_source_from_toml; docs/data-sources.md).
"""

from __future__ import annotations

from edge_sdk.sources.base import DataSource, NoData, SourceRead
from edge_sdk.sources.csv_file import CsvSource
from edge_sdk.sources.dataset import DatasetSource
from edge_sdk.sources.images import ImageFolderSource
from edge_sdk.sources.loader import PythonSource
from edge_sdk.sources.npz import NpzSource
from edge_sdk.sources.options import ReadOptions
from edge_sdk.sources.sqlite_db import SqliteSource
from edge_sdk.sources.table import Columns
from edge_sdk.sources.windows import WindowedSource, WindowSpec

__all__ = ["Columns", "CsvSource", "DataSource", "DatasetSource", "ImageFolderSource", "NoData", "NpzSource",
           "PythonSource", "ReadOptions", "SourceRead", "SqliteSource", "WindowedSource", "WindowSpec"]
