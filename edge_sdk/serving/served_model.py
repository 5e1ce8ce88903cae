"""The model a device serves: its installed ``<state_dir>/model.onnx`` (what the coordinator
published and the device checked), run by onnxruntime — no torch. A newly installed model is taken
between windows; one that cannot be loaded, or whose input the readings cannot fill, is one line in
the log and the model before it keeps serving."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_sdk.inference import MODEL_FILENAME, OnnxClassifier
from edge_sdk.model_store import MODEL_INFO_FILENAME, read_model_info

__all__ = ["ServedModel", "Served"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """One loaded model and what it is."""

    classifier: OnnxClassifier
    version: int  # the published version (0: a model from before versions were sent; its round then)
    label: str
    sha256: str
    classes: tuple[str, ...]
    channels: int  # 0: not read from readings (a device that serves its source's rows only)
    length: int | None  # None: any length (the model resamples, or repeats and cuts)


class ServedModel:
    """Loads the installed model and reloads it when model.json changes."""

    def __init__(self, state_dir: str | Path, channels: int, length: int | None = None, threads: int = 1) -> None:
        """``channels``: the readings a window holds (0: none, any input the model takes)."""
        self.state_dir, self.channels, self.length, self.threads = Path(state_dir), channels, length, threads
        self.served: Served | None = None
        self._seen: tuple[float, int] | None = None  # model.json's (mtime, size) last looked at

    def current(self) -> Served | None:
        """The model to serve now (None: none installed, or none usable yet)."""
        info_path = self.state_dir / MODEL_INFO_FILENAME
        try:
            stat = info_path.stat()
        except OSError:
            return self.served
        if (stat.st_mtime, stat.st_size) != self._seen:
            self._seen = (stat.st_mtime, stat.st_size)
            self._load()
        return self.served

    def _load(self) -> None:
        try:
            info = read_model_info(self.state_dir) or {}
            if self.served is not None and info.get("sha256") == self.served.sha256:
                return
            classifier = OnnxClassifier(self.state_dir / MODEL_FILENAME, threads=self.threads)
            served = self._describe(classifier, info)
        except (OSError, ValueError, ImportError) as exc:
            log.error("the installed model cannot be served (%s); %s", exc,
                      "the one before keeps serving" if self.served else "nothing is served")
            return
        log.info("serving the %s model, version %d (%s), on %d channel(s) x %s readings", served.label,
                 served.version, served.sha256[:12], served.channels, served.length or "any number of")
        self.served = served

    def _describe(self, classifier: OnnxClassifier, info: dict) -> Served:
        prep = classifier.preprocessing
        classes = tuple(prep.classes) if prep is not None and prep.classes else ()
        version, label, sha256 = int(info.get("version") or info.get("round") or 0), str(info.get("label", "")), \
            str(info.get("sha256", ""))
        if self.channels == 0:  # no readings, only the [data] source's rows: whatever the model takes
            return Served(classifier, version, label, sha256, classes, 0, None)
        if prep is not None and prep.any_length:
            channels, length = prep.input_shape[0], None
        elif classifier.sample_shape is not None and len(classifier.sample_shape) == 2:
            channels, length = classifier.sample_shape
        elif classifier.sample_shape is not None and len(classifier.sample_shape) == 1 and self.channels == 1:
            channels, length = 1, classifier.sample_shape[0]
        else:
            raise ValueError(f"its input {classifier.sample_shape} is not a series (channels, length)")
        if channels != self.channels:
            raise ValueError(f"it takes {channels} channel(s); [serve] reads {self.channels}")
        if length is not None and self.length is not None and length != self.length:
            raise ValueError(f"it takes {length} points a window; [serve] length is {self.length}")
        if length is None and self.length is None:
            raise ValueError("it takes series of any length: set [serve] length (points a window)")
        return Served(classifier, version, label, sha256, classes, channels, length or self.length)

    @staticmethod
    def probabilities(served: Served, values: np.ndarray) -> np.ndarray:
        """Softmax probabilities of one window ``(channels, length)``."""
        return served.classifier.predict(values[None]).probabilities[0]
