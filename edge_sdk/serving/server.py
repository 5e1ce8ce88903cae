"""A device runs its installed model on live readings (docs/serving.md): it subscribes to the
``[serve]`` topics on its own MQTT connection, cuts the readings into windows (`WindowBuilder`),
classifies each with onnxruntime (`ServedModel`, no torch) and publishes the prediction — class,
probability, top 3, the window's time span, the model version — retained on its prediction topic,
at most ``max_per_s`` a second, and into a rolling log in ``state_dir``. It serves whether or not a
coordinator is reachable. Windows labelled by the home (``[labels]``, `HomeLabels`) and a person's
corrections go into the device's label store (`LabelStore`), which its training reads."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_sdk.networking.token_bucket import TokenBucket
from edge_sdk.networking.transport import IncomingMessage, MqttTransport
from edge_sdk.protocol.topics import Topics
from edge_sdk.serving.corrections import CorrectionRefused, Corrections
from edge_sdk.serving.home_labels import HomeLabels, LabelsConfig
from edge_sdk.data.label_store import CORRECTION, EVENT, LabelStore
from edge_sdk.serving.prediction_log import PredictionLog
from edge_sdk.serving.readings import BadReading, parse_reading
from edge_sdk.serving.serve_config import ServeConfig
from edge_sdk.serving.served_model import Served, ServedModel
from edge_sdk.serving.source_rows import SourceRows
from edge_sdk.serving.windows import Window, WindowBuilder

__all__ = ["Server"]

log = logging.getLogger(__name__)

TOP = 3  # classes a prediction lists


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="microseconds")


class Server:
    """Serves one device's model on its ``[serve]`` topics."""

    def __init__(self, config: ServeConfig, transport: MqttTransport, topics: Topics, device_id: str,
                 state_dir: str | Path, clock: Callable[[], float] = time.time, labels: LabelsConfig | None = None,
                 holdout: float | None = 0.0, rows: SourceRows | None = None) -> None:
        self.config, self.transport, self.device_id, self.clock = config, transport, device_id, clock
        self.prediction_topic = topics.prediction(device_id)
        self.correction_topic, self.correction_state = topics.correction(device_id), topics.correction_state(device_id)
        self.corrections = Corrections()
        self.store = LabelStore(state_dir, config.store_rows, holdout)  # `holdout`: the device's [data] holdout
        self.labels = HomeLabels(labels, clock) if labels is not None else None
        self.rows = rows  # [serve] rows: the [data] source's new unlabelled rows
        # rows come a read at a time: as many a read as max_per_s allows over the interval between reads
        self.rows_bucket = TokenBucket(config.max_per_s, max(1, int(config.max_per_s * rows.every_s))) if rows \
            else None
        self.availability_topic = topics.serving_availability(device_id)
        self.model = ServedModel(state_dir, len(config.inputs), config.length, config.threads)
        self.channel_of = {item.topic: i for i, item in enumerate(config.inputs)}
        self.builder: WindowBuilder | None = None
        self._built_for: str | None = None  # the sha256 of the model the builder was made for
        self._last: dict[str, tuple[float, float | None]] = {}  # JSON topics: the last (value, time)
        self.bucket = TokenBucket(config.max_per_s, 1)
        self.log = PredictionLog(state_dir, config.log_lines)
        self.counts = {"predictions": 0, "rate_limited": 0, "retained_skipped": 0, "no_model": 0, "unknown_topic": 0,
                       "store_failed": 0, "rows_unfit": 0}
        self.latest: dict[str, Any] | None = None

    def start(self) -> None:
        """Subscribe to the input topics (QoS 0: a reading lost is a reading, not a retry)."""
        topics = [(item.topic, 0) for item in self.config.inputs] + [(self.correction_topic, 1)]
        if self.labels is not None:
            topics += [(topic, 1) for topic in (self.labels.config.topic, self.labels.config.time_topic) if topic]
        self.transport.subscribe_many(list(dict(topics).items()))  # a plug's topic may be a reading and its label
        log.info("%s serves on %s; predictions on %s", self.device_id,
                 ", ".join(repr(item.topic) for item in self.config.inputs), self.prediction_topic)

    def close(self) -> None:
        """Say ``offline`` (a clean disconnect sends no last will) and disconnect."""
        self.transport.publish(self.availability_topic, b"offline", qos=1, retain=True)
        self.transport.wait_published(2.0)
        self.transport.close()
        self.store.close()

    def run(self, stop: threading.Event) -> None:
        """Handle readings until ``stop`` is set."""
        self.start()
        while not stop.is_set():
            message = self.transport.receive(timeout=0.5)
            if message is not None:
                self.handle(message)
            if self.rows is not None and self.rows.due():
                self._serve_rows()

    def handle(self, message: IncomingMessage) -> dict[str, Any] | None:
        """One MQTT message; returns the prediction it completed, if any."""
        if message.topic == self.correction_topic:
            self._correct(message.payload)
            return None
        labels_topic = self.labels is not None and message.topic == self.labels.config.topic
        if self.labels is not None:
            if labels_topic:
                served = self.model.current()
                self.labels.on_state(message.payload, message.retained, served.classes if served else ())
            elif message.topic == self.labels.config.time_topic:
                self.labels.on_time(message.payload)
                return None
        channel = self.channel_of.get(message.topic)
        if channel is None:
            if not labels_topic:
                self.counts["unknown_topic"] += 1
            return None
        if message.retained:  # a state from some time ago, not a reading now
            self.counts["retained_skipped"] += 1
            return None
        served = self.model.current()
        builder = self._builder(served)
        if builder is None:
            self.counts["no_model"] += 1
            return None
        item = self.config.inputs[channel]
        try:
            reading = parse_reading(message.payload, item.field, item.time_field)
        except BadReading as exc:
            log.warning("%s: a bad reading on %r: %s (a new window starts)", self.device_id, message.topic, exc)
            builder.note_bad()
            return None
        if item.field is not None:  # zigbee2mqtt re-sends its whole state on any change: the same value is a repeat
            key = (reading.value, reading.time)
            if self._last.get(message.topic) == key:
                builder.counts.repeats += 1
                return None
            self._last[message.topic] = key
        prediction = None
        for window in builder.add(channel, reading.value, reading.time if reading.time is not None else self.clock()):
            self._label(window)
            if served is not None:
                prediction = self._predict(served, window) or prediction
        return prediction

    def _builder(self, served: Served | None) -> WindowBuilder | None:
        """Windows of the served model's length; before any model, of ``[serve] length`` when the
        home labels windows (they are kept for training the first model); else None."""
        if served is None and (self.labels is None or self.config.length is None):
            return None
        made_for = served.sha256 if served is not None else "labels"
        if self.builder is None or self._built_for != made_for:
            counts = self.builder.counts if self.builder is not None else None
            channels, length = (served.channels, served.length) if served is not None else \
                (len(self.config.inputs), self.config.length)
            assert length is not None
            self.builder = WindowBuilder(channels, length, period_s=self.config.period_s,
                                         stride=self.config.stride, max_gap_s=self.config.max_gap_s)
            if counts is not None:
                self.builder.counts = counts
            self._built_for = made_for
            if served is not None and served.classes:
                try:  # the names the store's labels are classes of, for training
                    self.store.set_classes(served.classes)
                except sqlite3.Error as exc:
                    log.error("%s: the label store: %s", self.device_id, " ".join(str(exc).split()))
        return self.builder

    def _label(self, window: Window) -> None:
        """A window the home labelled goes into the store."""
        if self.labels is None:
            return
        label = self.labels.label_for(window.start, window.end)
        if label is not None:
            self._keep(window, label, EVENT)

    def _keep(self, window: Window, label: str, origin: str) -> bool:
        try:
            self.store.add(window.start, window.end, window.values, label, origin)
            return True
        except sqlite3.Error as exc:  # a full disk, a locked file: counted, serving goes on
            self.counts["store_failed"] += 1
            log.error("%s: keeping a labelled window failed: %s", self.device_id, " ".join(str(exc).split()))
            return False

    def _predict(self, served: Served, window: Window) -> dict[str, Any] | None:
        if not self.bucket.take():
            self.counts["rate_limited"] += 1
            return None
        p = ServedModel.probabilities(served, window.values)
        prediction = self._publish(served, p, {"start": _iso(window.start), "end": _iso(window.end)})
        self.corrections.remember(prediction["end"], window)
        return prediction

    def _serve_rows(self) -> None:
        """New unlabelled rows of the [data] source, predicted (`SourceRows`)."""
        served = self.model.current()
        if served is None or self.rows is None or self.rows_bucket is None:
            return
        for key, sample in self.rows.new():
            if not self.rows_bucket.take():
                self.counts["rate_limited"] += 1
                continue
            try:
                p = ServedModel.probabilities(served, sample)
            except Exception as exc:  # onnxruntime's errors have no common base: a row the model cannot take
                self.counts["rows_unfit"] += 1
                log.error("%s: row %d does not fit the model (%s)", self.device_id, key,
                          " ".join(str(exc).split())[:200])
                continue
            now = _iso(self.clock())
            self._publish(served, p, {"start": now, "end": now, "row": str(key)})

    def _publish(self, served: Served, p: np.ndarray, span: dict[str, str]) -> dict[str, Any]:
        """Publish (retained) and log the prediction ``p`` of one window or row."""
        best = np.argsort(-p)[:TOP]

        def name(k: int) -> str:
            return served.classes[k] if k < len(served.classes) else str(k)
        prediction = {"class": name(int(best[0])), "index": int(best[0]), "probability": round(float(p[best[0]]), 6),
                      "top": [{"class": name(int(k)), "probability": round(float(p[k]), 6)} for k in best],
                      **span, "version": served.version, "model": served.label, "time": _iso(self.clock())}
        self.counts["predictions"] += 1
        self.latest = prediction
        self.log.append(prediction)
        self.transport.publish(self.prediction_topic, json.dumps(prediction).encode(), qos=1, retain=True)
        return prediction

    def _correct(self, payload: bytes) -> None:
        served = self.model.current()
        classes = served.classes if served is not None else ()
        try:
            name, window = self.corrections.take(payload, classes)
        except CorrectionRefused as exc:
            log.warning("%s: a correction refused: %s", self.device_id, exc)
        else:
            if self._keep(window, name, CORRECTION):
                log.info("%s: the prediction of the window ending %s corrected to %r", self.device_id,
                         _iso(window.end), name)
        self.transport.publish(self.correction_state, b"None", qos=1, retain=True)  # the select may be used again
