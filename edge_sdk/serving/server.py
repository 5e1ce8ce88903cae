"""A device runs its installed model on live readings (docs/serving.md): it subscribes to the
``[serve]`` topics on its own MQTT connection, cuts the readings into windows (`WindowBuilder`),
classifies each with onnxruntime (`ServedModel`, no torch) and publishes the prediction — class,
probability, top 3, the window's time span, the model version — retained on its prediction topic,
at most ``max_per_s`` a second, and into a rolling log in ``state_dir``. It serves whether or not a
coordinator is reachable."""

from __future__ import annotations

import json
import logging
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
from edge_sdk.serving.prediction_log import PredictionLog
from edge_sdk.serving.readings import BadReading, parse_reading
from edge_sdk.serving.serve_config import ServeConfig
from edge_sdk.serving.served_model import Served, ServedModel
from edge_sdk.serving.windows import Window, WindowBuilder

__all__ = ["Server"]

log = logging.getLogger(__name__)

TOP = 3  # classes a prediction lists


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


class Server:
    """Serves one device's model on its ``[serve]`` topics."""

    def __init__(self, config: ServeConfig, transport: MqttTransport, topics: Topics, device_id: str,
                 state_dir: str | Path, clock: Callable[[], float] = time.time) -> None:
        self.config, self.transport, self.device_id, self.clock = config, transport, device_id, clock
        self.prediction_topic = topics.prediction(device_id)
        self.correction_topic, self.correction_state = topics.correction(device_id), topics.correction_state(device_id)
        self.corrections = Corrections(state_dir)
        self.availability_topic = topics.serving_availability(device_id)
        self.model = ServedModel(state_dir, len(config.inputs), config.length, config.threads)
        self.channel_of = {item.topic: i for i, item in enumerate(config.inputs)}
        self.builder: WindowBuilder | None = None
        self._built_for: str | None = None  # the sha256 of the model the builder was made for
        self._last: dict[str, tuple[float, float | None]] = {}  # JSON topics: the last (value, time)
        self.bucket = TokenBucket(config.max_per_s, 1)
        self.log = PredictionLog(state_dir, config.log_lines)
        self.counts = {"predictions": 0, "rate_limited": 0, "retained_skipped": 0, "no_model": 0, "unknown_topic": 0}
        self.latest: dict[str, Any] | None = None

    def start(self) -> None:
        """Subscribe to the input topics (QoS 0: a reading lost is a reading, not a retry)."""
        self.transport.subscribe_many([(item.topic, 0) for item in self.config.inputs] + [(self.correction_topic, 1)])
        log.info("%s serves on %s; predictions on %s", self.device_id,
                 ", ".join(repr(item.topic) for item in self.config.inputs), self.prediction_topic)

    def close(self) -> None:
        """Say ``offline`` (a clean disconnect sends no last will) and disconnect."""
        self.transport.publish(self.availability_topic, b"offline", qos=1, retain=True)
        self.transport.wait_published(2.0)
        self.transport.close()

    def run(self, stop: threading.Event) -> None:
        """Handle readings until ``stop`` is set."""
        self.start()
        while not stop.is_set():
            message = self.transport.receive(timeout=0.5)
            if message is not None:
                self.handle(message)

    def handle(self, message: IncomingMessage) -> dict[str, Any] | None:
        """One MQTT message; returns the prediction it completed, if any."""
        if message.topic == self.correction_topic:
            self._correct(message.payload)
            return None
        channel = self.channel_of.get(message.topic)
        if channel is None:
            self.counts["unknown_topic"] += 1
            return None
        if message.retained:  # a state from some time ago, not a reading now
            self.counts["retained_skipped"] += 1
            return None
        served = self.model.current()
        if served is None:
            self.counts["no_model"] += 1
            return None
        builder = self._builder(served)
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
            prediction = self._predict(served, window) or prediction
        return prediction

    def _builder(self, served: Served) -> WindowBuilder:
        if self.builder is None or self._built_for != served.sha256:
            counts = self.builder.counts if self.builder is not None else None
            assert served.length is not None
            self.builder = WindowBuilder(served.channels, served.length, period_s=self.config.period_s,
                                         stride=self.config.stride, max_gap_s=self.config.max_gap_s)
            if counts is not None:
                self.builder.counts = counts
            self._built_for = served.sha256
        return self.builder

    def _predict(self, served: Served, window: Window) -> dict[str, Any] | None:
        if not self.bucket.take():
            self.counts["rate_limited"] += 1
            return None
        p = ServedModel.probabilities(served, window.values)
        best = np.argsort(-p)[:TOP]

        def name(k: int) -> str:
            return served.classes[k] if k < len(served.classes) else str(k)
        prediction = {"class": name(int(best[0])), "index": int(best[0]), "probability": round(float(p[best[0]]), 6),
                      "top": [{"class": name(int(k)), "probability": round(float(p[k]), 6)} for k in best],
                      "start": _iso(window.start), "end": _iso(window.end), "version": served.version,
                      "model": served.label, "time": _iso(self.clock())}
        self.counts["predictions"] += 1
        self.latest = prediction
        self.corrections.remember(prediction["end"], window.values)
        self.log.append(prediction)
        self.transport.publish(self.prediction_topic, json.dumps(prediction).encode(), qos=1, retain=True)
        return prediction

    def _correct(self, payload: bytes) -> None:
        served = self.model.current()
        classes = served.classes if served is not None else ()
        try:
            row = self.corrections.take(payload, classes)
        except CorrectionRefused as exc:
            log.warning("%s: a correction refused: %s", self.device_id, exc)
        else:
            log.info("%s: the prediction of the window ending %s corrected to %r", self.device_id, row["end"],
                     row["class"])
        self.transport.publish(self.correction_state, b"None", qos=1, retain=True)  # the select may be used again
