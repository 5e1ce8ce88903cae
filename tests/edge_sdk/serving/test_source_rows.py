"""`[serve] rows = true`: a device predicts the new rows of its own data source whose label is
empty — here windows of a CSV sensor log — over a real broker: at start the newest one, then each
window appended; labelled rows are never predicted, and the prediction is `edgefl predict`'s."""

from __future__ import annotations

import csv
import threading
import time

import numpy as np
import pytest

from edge_sdk.inference import OnnxClassifier
from edge_sdk.protocol.topics import Topics
from edge_sdk.serving.serve_command import server_from_toml
from edge_sdk.sources.from_toml import data_source_from_toml
from tests.support.serving import LENGTH, Home, install_model


def append(path, start: int, watts: np.ndarray, label: str) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as fh:
        writer = csv.writer(fh)
        if new:
            writer.writerow(["ts", "power", "label"])
        for i, w in enumerate(watts):
            writer.writerow([start + i, f"{w:.2f}", label])


def test_new_unlabelled_windows_of_the_source_are_predicted(tmp_path, broker) -> None:
    install_model(tmp_path)
    log = tmp_path / "readings.csv"
    rng = np.random.default_rng(0)
    series = rng.normal(100.0, 50.0, size=(5, LENGTH))
    append(log, 0, series[0], "idle")
    append(log, LENGTH, series[1], "kettle")
    append(log, 2 * LENGTH, series[2], "")  # not labelled yet: the state now
    toml = tmp_path / "client.toml"
    toml.write_text(f'device_id = "plug"\njob = "home"\nstate_dir = "{tmp_path}"\n[broker]\nurl = "{broker.url}"\n'
                    f'[data]\ncsv = "{log}"\nkey = "ts"\nwindow = {LENGTH}\nclasses = ["idle", "kettle"]\n'
                    f'reread_s = 0.2\n[serve]\nrows = true\nmax_per_s = 100\n')
    server = server_from_toml(toml)
    assert server is not None and server.rows is not None
    home = Home(broker.url, Topics(job="home").prediction("plug"))
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop,), daemon=True)
    thread.start()
    try:
        home.read(lambda: len(home.predictions) >= 1)
        append(log, 3 * LENGTH, series[3], "")  # two more windows nobody labelled, one labelled
        append(log, 4 * LENGTH, series[4], "")
        append(log, 5 * LENGTH, series[0], "idle")
        home.read(lambda: len(home.predictions) >= 3)
        time.sleep(0.5)  # and nothing more
        home.read(lambda: False, timeout=0.3)
    finally:
        stop.set()
        thread.join(timeout=5)
        home.transport.close()
    assert [p["row"] for p in home.predictions] == [str(3 * LENGTH - 1), str(4 * LENGTH - 1), str(5 * LENGTH - 1)]
    expected = OnnxClassifier(tmp_path / "model.onnx").predict(series[2:5, None, :].astype(np.float32))
    assert [p["index"] for p in home.predictions] == list(expected.classes)
    np.testing.assert_allclose([p["probability"] for p in home.predictions], expected.probabilities.max(axis=1),
                               atol=1e-4)
    assert server.rows.counts["rows_new"] == 3 and server.counts["rows_unfit"] == 0


def test_rows_need_a_csv_or_sqlite_source() -> None:
    with pytest.raises(ValueError, match=r"\[serve\] rows reads the rows of a csv or sqlite \[data\] source"):
        data_source_from_toml({"data": {"npz": "/tmp/x.npz"}}, unlabelled=True)
