"""The device's own label store as a data source: the windows the home labelled and a person
corrected while the device served (edge_sdk/data/label_store.py), read again every round it
trains, like any source. Corrections of windows no event labelled come back ``train_only``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from edge_sdk.data.label_store import CORRECTION, STORE_FILENAME, LabelStore
from edge_sdk.sources.assemble import WRONG_SHAPE, assemble
from edge_sdk.sources.base import NoData, Skipped, SourceRead
from edge_sdk.sources.labels import map_labels
from edge_sdk.sources.options import ReadOptions

__all__ = ["LabelStoreSource"]


class LabelStoreSource:
    """``<state_dir>/labels.sqlite``; labels are class names, mapped by ``[data] classes`` or, without
    them, by the class names of the model the device served when it labelled them."""

    def __init__(self, state_dir: str | Path, options: ReadOptions | None = None) -> None:
        self.path = Path(state_dir).expanduser() / STORE_FILENAME
        self.options = options or ReadOptions()
        self.description = f"label store {self.path}"

    def read(self) -> SourceRead:
        where = str(self.path)
        try:
            rows = LabelStore.read(self.path)
        except FileNotFoundError:
            raise NoData(f"{where}: no labelled windows yet (the home's [labels] and corrections write them)") from None
        if not len(rows):
            raise NoData(f"{where}: no labelled windows yet")
        options = self.options if self.options.classes else replace(self.options, classes=rows.classes)
        skipped = Skipped()
        if rows.other_shape:
            skipped[WRONG_SHAPE] += rows.other_shape
        y = map_labels(rows.labels, options, where)
        data = assemble(rows.values, y, rows.keys, options, skipped, where, order=-np.arange(len(rows)),
                        unit="windows")
        corrected = rows.keys[np.array([origin == CORRECTION for origin in rows.origins], dtype=bool)]
        return SourceRead(data, None, skipped.report(where, "windows"), train_only=np.isin(data.keys, corrected))
