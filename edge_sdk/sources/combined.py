"""Two or more sources read as one: a device's ``[data]`` source and its label store
(edge_sdk/sources/label_store_source.py). Their samples must have one shape and normalisation; a part
with no data yet leaves the others (NoData only when every part has none)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edge_sdk.sources.base import DataSource, NoData, SourceRead

__all__ = ["CombinedSource"]


class CombinedSource:
    def __init__(self, parts: list[DataSource]) -> None:
        if len(parts) < 2:
            raise ValueError("a combined source needs two sources or more")
        self.parts = parts
        self.description = " + ".join(part.description for part in parts)

    def read(self) -> SourceRead:
        reads, empty = [], []
        for part in self.parts:
            try:
                reads.append((part, part.read()))
            except NoData as exc:
                empty.append(str(exc))
        if not reads:
            raise NoData("; ".join(empty))
        first_part, first = reads[0]
        for part, read in reads[1:]:
            a, b = first.data, read.data
            if a.x.shape[1:] != b.x.shape[1:]:
                raise ValueError(f"{part.description} gives samples of shape {list(b.x.shape[1:])} but "
                                 f"{first_part.description} of {list(a.x.shape[1:])}")
            if (a.preprocessing is None) != (b.preprocessing is None) or \
                    a.preprocessing is not None and not a.preprocessing.same_normalisation(b.preprocessing):
                raise ValueError(f"{part.description} and {first_part.description} give samples in other "
                                 "normalisations (one raw, one normalised)")
        datas = [read.data for _, read in reads]
        data = replace(datas[0], x=np.concatenate([d.x for d in datas]), y=np.concatenate([d.y for d in datas]),
                       num_classes=max(d.num_classes for d in datas),
                       keys=np.concatenate([d.keys for d in datas]) if all(d.keys is not None for d in datas)
                       else None)
        train_only = np.concatenate([read.train_only if read.train_only is not None else np.zeros(len(read.data), bool)
                                     for _, read in reads])
        skipped: dict[str, int] = {}
        for _, read in reads:
            for reason, n in read.skipped.items():
                skipped[reason] = skipped.get(reason, 0) + n
        test = next((read.test for _, read in reads if read.test is not None), None)
        return SourceRead(data, test, skipped, train_only if train_only.any() else None)
