"""Build a `DeviceClient` from a client TOML file (see deploy/raspberrypi/client.toml)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from edge_sdk.accelerator import resolve_device
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.config import in_file, link_from_toml, read_toml, section, setting, transport_from_toml
from edge_sdk.data.datasets import DATASETS
from edge_sdk.data.holdout import DEFAULT_HOLDOUT, SOURCE_TEST_SET, check_holdout
from edge_sdk.paths import writable_dir
from edge_sdk.profiling import DeviceProfile, load_profile, measure_device
from edge_sdk.schedule import SchedulePolicy
from edge_sdk.signing import load_public_key
from edge_sdk.sources import (
    Columns, CsvSource, DatasetSource, DataSource, ImageFolderSource, NoData, NpzSource, PythonSource, ReadOptions,
    SqliteSource, WindowedSource, WindowSpec,
)
from edge_sdk.serving.serve_command import DEFAULT_STATE_DIR, serving_tables
from edge_sdk.sources.combined import CombinedSource
from edge_sdk.sources.label_store_source import LabelStoreSource
from edge_sdk.sources.npz import npz_has_test
from edge_sdk.training import default_threads

__all__ = ["DEFAULT_HOLDOUT", "client_from_toml", "data_source_from_toml", "holdout_from_toml",
           "remeasure_settings", "schedule_from_toml", "training_device", "training_source", "trusted_keys"]

log = logging.getLogger(__name__)

_TOP_KEYS = {"device_id", "job", "state_dir", "heartbeat_s", "seed", "broker", "data", "device", "link",
             "schedule", "security", "serve", "labels"}
#: the `[data]` keys naming a source (one of them; none: dataset = "mnist-sample")
_SOURCE_KEYS = ("dataset", "npz", "csv", "sqlite", "images", "python")
#: keys that only some sources take
_KEY_OWNERS = {"root": ("dataset",), "partition": ("dataset",), "shard": ("dataset",), "shards": ("dataset",),
               "query": ("sqlite",), "python_path": ("python",), "label": ("csv", "sqlite"),
               "features": ("csv", "sqlite"), "key": ("csv", "sqlite"), "window": ("csv", "sqlite"),
               "stride": ("csv", "sqlite"), "window_label": ("csv", "sqlite")}
_DATA_KEYS = {*_SOURCE_KEYS, *_KEY_OWNERS, "max_samples", "input_shape", "classes", "num_classes", "holdout",
              "reread_s"}
_DEVICE_KEYS = {"profile", "measure_seconds", "device", "remeasure_every_s"}
#: `[device] remeasure_every_s` when the profile is measured ("measure") and the key is absent
DEFAULT_REMEASURE_S = 3600.0


def data_source_from_toml(config: dict) -> DataSource:
    """The data source the `[data]` table names (docs/data-sources.md): exactly one of
    ``npz``, ``csv``, ``sqlite`` (with ``query``), ``images``, ``python`` or ``dataset`` (a public
    dataset or ``"npz:/path"``; the default, ``mnist-sample``), with the shared ``input_shape``,
    ``classes``, ``num_classes`` and ``max_samples``. A bad key is a one-line ValueError naming it."""
    data = section(config, "data", _DATA_KEYS)
    kinds = [k for k in _SOURCE_KEYS if k in data]
    if len(kinds) > 1:
        raise ValueError(f"[data] names {len(kinds)} sources ({', '.join(kinds)}); give one")
    kind = kinds[0] if kinds else "dataset"
    for key, owners in _KEY_OWNERS.items():
        if key in data and kind not in owners:
            raise ValueError(f"[data] {key} applies to {' and '.join(owners)} only, not to {kind}")
    options = _read_options(data)
    if kind == "dataset":
        return _dataset_source(config, data, options)
    path = setting(data, kind, str, None, "[data]")
    if not path:
        raise ValueError(f"[data] {kind} must not be empty")
    if kind == "npz":
        return NpzSource(path, options)
    if kind == "images":
        return ImageFolderSource(path, options)
    if kind == "python":
        folder = setting(data, "python_path", str, None, "[data]")
        if folder is not None and not Path(folder).expanduser().is_dir():
            raise ValueError(f"[data] python_path {folder} is not a folder")
        return PythonSource(path, folder, options)
    features = _names(data, "features")
    columns = Columns(label=setting(data, "label", str, "label", "[data]"), features=features,
                      key=setting(data, "key", str, None, "[data]"), first_is_key=kind == "sqlite")
    windows = _windows(data)
    reading = options if windows is None else WindowedSource.reading_options(options)
    if kind == "csv":
        source: DataSource = CsvSource(path, columns, reading)
    elif "query" not in data:
        raise ValueError('[data] sqlite needs query = "SELECT ..." (e.g. "SELECT ts, temp, humidity, label FROM '
                         'readings")')
    else:
        source = SqliteSource(path, data["query"], columns, reading)
    return source if windows is None else WindowedSource(source, windows, options)


def _windows(data: dict) -> WindowSpec | None:
    """`[data] window`, `stride`, `window_label`: readings cut into windows (sources/windows.py)."""
    if "window" not in data:
        for key in ("stride", "window_label"):
            if key in data:
                raise ValueError(f"[data] {key} needs window = L (readings per window)")
        return None
    return WindowSpec(setting(data, "window", int, None, "[data]"), setting(data, "stride", int, None, "[data]"),
                      setting(data, "window_label", str, "last", "[data]"))


def holdout_from_toml(config: dict) -> float | None:
    """`[data] holdout`: the share of its data a device holds out for federated evaluation, a
    fraction in (0, 0.9]; default DEFAULT_HOLDOUT, or `SOURCE_TEST_SET` when the source is an npz
    holding x_test and y_test and no holdout is given."""
    data = section(config, "data", _DATA_KEYS)
    if "holdout" in data:
        return check_holdout(data["holdout"], "[data] holdout")
    source = data_source_from_toml(config)
    if isinstance(source, NpzSource) and npz_has_test(source.path):
        return SOURCE_TEST_SET
    return DEFAULT_HOLDOUT


def _read_options(data: dict) -> ReadOptions:
    shape = setting(data, "input_shape", list, None, "[data]")
    classes = _names(data, "classes")
    return ReadOptions(input_shape=None if shape is None else tuple(shape), classes=classes or (),
                       num_classes=setting(data, "num_classes", int, None, "[data]"),
                       max_samples=setting(data, "max_samples", int, None, "[data]"))


def _names(data: dict, key: str) -> tuple[str, ...] | None:
    """A list of non-empty strings (`features`, `classes`), or None when absent."""
    value = setting(data, key, list, None, "[data]")
    if value is not None and (not value or not all(isinstance(v, str) and v for v in value)):
        raise ValueError(f"[data] {key} must be a list of names, e.g. {key} = [\"a\", \"b\"]")
    return None if value is None else tuple(value)


def _dataset_source(config: dict, data: dict, options: ReadOptions) -> DataSource:
    """`dataset`: a public dataset's train split or one shard of it, or "npz:/path"."""
    root = setting(data, "root", str, None, "[data]")
    if root is not None and not Path(root).expanduser().is_dir():
        raise ValueError(f"[data] root {root} is not a folder")
    name = setting(data, "dataset", str, "mnist-sample", "[data]")
    if not name.startswith("npz:") and name not in DATASETS:
        raise ValueError(f"[data] dataset must be one of {', '.join(DATASETS)} or 'npz:<path>', got {name!r}")
    if "shard" not in data and name.startswith("npz:"):
        return NpzSource(name[4:], options)
    for key in ("input_shape", "classes", "num_classes"):
        if key in data:
            raise ValueError(f"[data] {key} does not apply to a public dataset ({name}): it has its own")
    if "shard" not in data:
        return DatasetSource(name, root, max_samples=options.max_samples)
    shards = setting(data, "shards", int, 1, "[data]")
    index = setting(data, "shard", int, 0, "[data]")
    if not 0 <= index < shards:
        raise ValueError(f"[data] shard must be in 0..{shards - 1}, got {index}")
    scheme = setting(data, "partition", str, "iid", "[data]")
    return DatasetSource(name, root, (index, shards, scheme), seed=setting(config, "seed", int, 0),
                         max_samples=options.max_samples)


def training_device(config: dict) -> str:
    """`[device] device`: where local training runs (auto, cpu, cuda, cuda:N); default auto."""
    name = section(config, "device", _DEVICE_KEYS).get("device", "auto")
    resolve_device(name)  # a one-line error now rather than at the first round
    return name


def trusted_keys(config: dict) -> tuple[bytes, ...]:
    """`[security] trusted_keys`: PEM files of the coordinator public keys whose signed models this
    device installs (several while a key is rotated); none: models are installed unchecked."""
    paths = section(config, "security", {"trusted_keys"}).get("trusted_keys", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise ValueError('[security] trusted_keys must be a list of PEM file paths, e.g. '
                         '["/etc/edgefl/model-signing.pub"]')
    return tuple(load_public_key(p) for p in paths)


def remeasure_settings(config: dict) -> tuple[float, float]:
    """`[device] remeasure_every_s` and `measure_seconds`: how often a running client measures its
    compute again (0: never; default DEFAULT_REMEASURE_S with `profile = "measure"`, else 0) and how
    long a measurement takes."""
    device = section(config, "device", _DEVICE_KEYS)
    measured = device.get("profile", "measure") == "measure"
    every = device.get("remeasure_every_s", DEFAULT_REMEASURE_S if measured else 0.0)
    seconds = device.get("measure_seconds", 1.0)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not (every == 0 or 60 <= every <= 7 * 86400):
        raise ValueError(f"[device] remeasure_every_s must be 0 (never) or seconds in [60, 604800], got {every!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 600:
        raise ValueError(f"[device] measure_seconds must be a number in (0, 600], got {seconds!r}")
    return float(every), float(seconds)


def _profile(config: dict, device_id: str) -> DeviceProfile:
    device = section(config, "device", _DEVICE_KEYS)
    choice = device.get("profile", "measure")
    if choice == "measure":  # the device training will use
        return measure_device(name=device_id, seconds=float(device.get("measure_seconds", 1.0)),
                              device=training_device(config))
    return load_profile(choice)


def client_from_toml(path: str | Path) -> DeviceClient:
    """A ready-to-run device client from a TOML config file; every error in it is one line that
    names the file and the key."""
    config = read_toml(path)
    try:
        return _client_from(config, path)
    except (ValueError, TypeError, OSError) as exc:
        raise in_file(path, exc) from None


def schedule_from_toml(config: dict) -> SchedulePolicy:
    """The `[schedule]` table; without `threads`, torch trains with half of the device's CPUs
    (`edge_sdk.training.default_threads`; on 2 cores, 2 threads ran 2.5-4x slower than 1 while
    other processes kept one or both cores busy)."""
    schedule = SchedulePolicy.from_dict(section(config, "schedule", set(SchedulePolicy.KEYS)))
    return schedule if schedule.threads is not None else replace(schedule, threads=default_threads())


def _client_from(config: dict, path: str | Path) -> DeviceClient:
    unknown = set(config) - _TOP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    if "device_id" not in config:
        raise ValueError(f"{path}: device_id is required")
    device_id = setting(config, "device_id", str)
    serves = serving_tables(config)[0] is not None  # checked now: a typo in [serve] stops the device at once
    state_dir = setting(config, "state_dir", str)
    if state_dir is not None:
        writable_dir(state_dir, "state_dir")
    remeasure_every_s, measure_seconds = remeasure_settings(config)
    client_config = ClientConfig(
        device_id=device_id,
        transport=transport_from_toml(config, client_id=device_id),
        job=setting(config, "job", str, "default"),
        link=link_from_toml(config),
        state_dir=state_dir,
        heartbeat_s=setting(config, "heartbeat_s", float, 30.0),
        seed=setting(config, "seed", int, 0),
        schedule=schedule_from_toml(config),
        device=training_device(config),
        trusted_keys=trusted_keys(config),
        remeasure_every_s=remeasure_every_s,
        measure_seconds=measure_seconds,
        holdout=holdout_from_toml(config),
        reread_s=setting(section(config, "data", _DATA_KEYS), "reread_s", float, 60.0, "[data]"),
        serves=serves,
    )
    source = training_source(config)
    try:  # read now for the registration; the client reads it again at the start of every round it trains
        first = source.read()
    except NoData as exc:  # it joins the fleet all the same, and trains once data has come
        log.warning("%s: no data yet: %s", device_id, exc)
        first = None
    return DeviceClient(client_config, first, _profile(config, device_id), source=source)


def training_source(config: dict) -> DataSource:
    """What the device trains on: its ``[data]`` source and, when it serves, the windows the home
    labelled and a person corrected (its label store in ``state_dir``); a device that serves and
    names no ``[data]`` source trains on its label store alone."""
    if serving_tables(config)[0] is None:
        return data_source_from_toml(config)
    data = section(config, "data", _DATA_KEYS)
    options = _read_options(data)
    store = LabelStoreSource(setting(config, "state_dir", str, DEFAULT_STATE_DIR),
                             ReadOptions(classes=options.classes, num_classes=options.num_classes,
                                         max_samples=options.max_samples))
    if not any(kind in data for kind in _SOURCE_KEYS):
        return store
    return CombinedSource([data_source_from_toml(config), store])
