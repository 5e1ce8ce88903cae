"""The device's own data: what it trains on, what it holds out for federated evaluation, its data
source read again every round it trains (it may have grown), and its data in the normalisation a
job names. Only counts and tensors leave the device, never this data."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from edge_sdk.data.holdout import NO_HOLDOUT, SOURCE_TEST_SET, sample_keys, split_holdout
from edge_sdk.methods import LocalData
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.protocol.messages import Evaluate, Plan

if TYPE_CHECKING:
    from edge_sdk.sources import DataSource, SourceRead

__all__ = ["DeviceData", "ReadFailed"]

log = logging.getLogger("edge_sdk.client")  # the device's log, whichever part of it speaks


class ReadFailed(NamedTuple):
    """Why the data source gave nothing to train on: the `no_data` error's text and the status's."""

    error: str
    status: str


def _short(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values[:4]) + (", ...]" if len(values) > 4 else "]")


class DeviceData:
    """A device's data: ``data`` to train on, ``holdout`` to evaluate on (`ClientConfig.holdout`)."""

    def __init__(self, device_id: str, holdout_share: float | None, source: DataSource | None,
                 data: LocalData | SourceRead | None, test: LocalData | None = None) -> None:
        self.device_id = device_id
        #: `ClientConfig.holdout`: the share held out, 0 (none) or None (the source's own test set)
        self.holdout_share = holdout_share
        #: where the data comes from, read again at the start of every round the device trains
        #: (edge_sdk/sources); None: the data as given, for good
        self.source = source
        self.data: LocalData  # what it trains on (its held-out share removed)
        self.holdout: LocalData | None  # what it evaluates on
        self.holdout_note: str  # why it holds nothing out
        self.waiting = 0  # held-out samples too few to evaluate yet (`HoldoutSplit.waiting`)
        #: the sorted keys of what it last trained on (None: it has not trained): `counts`' watermark
        self.trained_keys: np.ndarray | None = None
        #: the job's normalisation the last plan named, and the data converted to it (`for_plan`)
        self._job_preprocessing: Preprocessing | None
        self._job_data_cache: LocalData
        if data is not None and not isinstance(data, LocalData):  # a source's first read
            self.use(data.data, data.test, data.train_only)
        else:
            self.use(data, test)

    def use(self, data: LocalData | None, test: LocalData | None = None, train_only: np.ndarray | None = None) -> None:
        """Train on ``data`` less its held-out share (`ClientConfig.holdout`; never the samples
        ``train_only`` marks), or hold out ``test``."""
        holdout = self.holdout_share
        self._job_preprocessing = None
        self.waiting = 0
        if data is None:
            self.data = LocalData(np.zeros((0,), np.float32), np.zeros(0, np.int64), 0)
            self.holdout, self.holdout_note = None, "it has no data"
        elif holdout is SOURCE_TEST_SET:
            self.data, self.holdout = data, test
            self.holdout_note = "" if test is not None else "its data source names no held-out set"
        elif holdout == NO_HOLDOUT:
            self.data, self.holdout, self.holdout_note = data, None, "it holds out no data ([data] holdout)"
        else:
            split = split_holdout(data, holdout, train_only)
            self.data, self.holdout, self.holdout_note = split.train, split.holdout, split.note
            self.waiting = split.waiting
        self._job_data_cache = self.data

    def read_again(self, rnd: int | None) -> ReadFailed | None:
        """Read the data source again (it may have grown) for round ``rnd`` (None: between rounds);
        a missing or empty one leaves the device no data, and says why: the device answers
        ``no_data`` and stays in the fleet, training nothing this round."""
        from edge_sdk.sources import NoData

        assert self.source is not None
        when = f"round {rnd + 1}" if rnd is not None else "re-read"
        try:
            read = self.source.read()
        except NoData as exc:
            log.warning("%s: %s: no data: %s", self.device_id, when, exc)
            self.use(None)
            return ReadFailed(str(exc)[:1000], f"no data: {exc}"[:200])
        except (ValueError, OSError) as exc:
            log.error("%s: %s: reading %s failed: %s", self.device_id, when, self.source.description, exc)
            return ReadFailed(f"reading its data failed: {exc}"[:1000], f"reading its data failed: {exc}"[:200])
        before = len(self.data)
        self.use(read.data, read.test, read.train_only)
        if len(self.data) != before:
            log.info("%s: %s: %d samples to train on (%d before)", self.device_id, when, len(self.data), before)
        return None

    def mark_trained(self) -> None:
        """What it trains on now was trained on: the watermark that `counts` measures new data from."""
        self.trained_keys = np.sort(self._keys(self.data))

    def counts(self) -> tuple[int, int, int]:
        """(training, new, held_out): its training samples, those not in the last round it trained
        (all of them before its first), and its held-out samples (those waiting included)."""
        keys = self._keys(self.data)
        new = len(keys) if self.trained_keys is None else int((~np.isin(keys, self.trained_keys)).sum())
        held = (len(self.holdout) if self.holdout is not None else 0) + self.waiting
        return len(self.data), new, held

    @staticmethod
    def _keys(data: LocalData) -> np.ndarray:
        return data.keys if data.keys is not None else sample_keys(data.x, data.y)

    def for_plan(self, plan: Plan) -> LocalData:
        """The device's data in the normalisation the plan names (converted once per job and
        kept: `LocalData.normalised_as`; raw uint8 bytes, a simulated device's shard, are converted
        each time and not kept); the data as loaded when the plan names none."""
        if plan.preprocessing is None:
            return self.data
        job = Preprocessing.from_dict(plan.preprocessing)
        own = self.data.preprocessing
        if own is not None and own.is_raw and self.data.x.dtype == np.uint8:
            return self.data.normalised_as(job)  # as cheap as a copy: none kept (a simulated device's bytes)
        if self._job_preprocessing is None or not self._job_preprocessing.same_normalisation(job):
            if own is not None and not own.same_normalisation(job):
                log.info("%s: normalising its data with the job's statistics (mean %s, std %s) instead of "
                         "its own", self.device_id, _short(job.mean), _short(job.std))
            self._job_data_cache = self.data.normalised_as(job)
            self._job_preprocessing = job
        return self._job_data_cache

    def holdout_for(self, request: Evaluate) -> LocalData | None:
        """The held-out data in the normalisation ``request`` names."""
        if self.holdout is None or request.preprocessing is None:
            return self.holdout
        return self.holdout.normalised_as(Preprocessing.from_dict(request.preprocessing))
