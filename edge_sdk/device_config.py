"""Build a `DeviceClient` from a client TOML file (see deploy/raspberrypi/client.toml)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from edge_sdk.accelerator import resolve_device
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.config import in_file, link_from_toml, read_toml, section, setting, transport_from_toml
from edge_sdk.paths import writable_dir
from edge_sdk.profiling import DeviceProfile, load_profile, measure_device
from edge_sdk.schedule import SchedulePolicy
from edge_sdk.signing import load_public_key
from edge_sdk.sources import NoData
from edge_sdk.serving.serve_command import serving_tables
from edge_sdk.sources.from_toml import (
    DATA_KEYS, DEFAULT_HOLDOUT, data_source_from_toml, holdout_from_toml, training_source,
)
from edge_sdk.training import default_threads

__all__ = ["DEFAULT_HOLDOUT", "client_from_toml", "data_source_from_toml", "holdout_from_toml",
           "remeasure_settings", "schedule_from_toml", "training_device", "training_source", "trusted_keys"]

log = logging.getLogger(__name__)

_TOP_KEYS = {"device_id", "job", "state_dir", "heartbeat_s", "seed", "broker", "data", "device", "link",
             "schedule", "security", "serve", "labels"}
_DEVICE_KEYS = {"profile", "measure_seconds", "device", "remeasure_every_s"}
#: `[device] remeasure_every_s` when the profile is measured ("measure") and the key is absent
DEFAULT_REMEASURE_S = 3600.0


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
        reread_s=setting(section(config, "data", DATA_KEYS), "reread_s", float, 60.0, "[data]"),
        serves=serves,
    )
    source = training_source(config, serves)
    try:  # read now for the registration; the client reads it again at the start of every round it trains
        first = source.read()
    except NoData as exc:  # it joins the fleet all the same, and trains once data has come
        log.warning("%s: no data yet: %s", device_id, exc)
        first = None
    return DeviceClient(client_config, first, _profile(config, device_id), source=source)
