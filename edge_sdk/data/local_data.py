"""A device's private data as arrays (`LocalData`): what every source returns and every method
trains on. Torch-free: a device that only serves reads its sources too."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_sdk.data.preprocessing import Preprocessing

__all__ = ["LocalData"]


@dataclass(frozen=True)
class LocalData:
    """A device's private training data; it never leaves the device."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    #: the normalisation ``x`` carries (the loader's: its own data's statistics); None: unknown,
    #: taken to be the job's already (e.g. a simulated device's shard of centrally normalised data)
    preprocessing: Preprocessing | None = None
    #: one stable uint64 key per sample (a row key, a timestamp, a hash of the sample), which does
    #: not change as the data grows: the federated-evaluation holdout is chosen by it
    #: (:mod:`edge_sdk.data.holdout`); None: none known (the holdout then hashes the samples)
    keys: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} inputs but {len(self.y)} labels")
        if self.keys is not None and (not isinstance(self.keys, np.ndarray) or self.keys.dtype != np.uint64
                                      or self.keys.shape != (len(self.y),)):
            raise ValueError(f"keys must be a uint64 array with one key per sample ({len(self.y)})")

    def __len__(self) -> int:
        return len(self.y)

    def normalised_as(self, job: Preprocessing) -> "LocalData":
        """This data in the job's normalisation: itself when it already is (or its own is
        unknown), else a converted copy (see `Preprocessing.convert_from`)."""
        own = self.preprocessing
        if own is None or own.same_normalisation(job):
            return self
        return LocalData(job.convert_from(own, self.x), self.y, self.num_classes, job, self.keys)
