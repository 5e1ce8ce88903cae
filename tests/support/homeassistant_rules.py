"""Home Assistant's rules for an MQTT *device-based* discovery message, transcribed by hand.

Home Assistant cannot be installed here (it needs Python >= 3.12), so every table and check below is
copied from its source; nothing is guessed. Where a check is not Home Assistant's, its message says so.

Source: Home Assistant Core **2024.11.0**, the first release with device-based discovery, read from the
release's wheel on PyPI (``homeassistant-2024.11.0-py3-none-any.whl``, sha256
``a87fe395059adfdfc5c839993812ac330638fea0361336354265b512358a14c6``), i.e. tag ``2024.11.0`` of
github.com/home-assistant/core. (The repository was too large to fetch, so the tag's commit id was not
read; the paths are the repository's.)

- ``homeassistant/components/mqtt/discovery.py``: ``TOPIC_MATCHER`` (-> ``DISCOVERY_TOPIC_RE``), the
  ``<prefix>/device/+/config`` and ``<prefix>/device/+/+/config`` subscriptions, ``_replace_all_abbreviations``
  (root keys, ``availability`` entries, ``device``, ``origin``, then each component), ``_merge_common_device_options``
  (root ``SHARED_OPTIONS`` fill in what a component lacks), ``_replace_topic_base`` (``~``, per component, after
  the merge), ``_parse_device_payload`` (``payload == ""`` clears the device).
- ``homeassistant/components/mqtt/schemas.py``: ``DEVICE_DISCOVERY_SCHEMA`` (its root takes only the keys in
  ``_ROOT_KEYS``; ``device``, ``components``, ``origin`` required), ``MQTT_ENTITY_DEVICE_INFO_SCHEMA``
  (``validate_device_has_at_least_one_identifier``), ``MQTT_ORIGIN_INFO_SCHEMA`` (``name`` required),
  the availability schemas, ``SHARED_OPTIONS``, ``_COMPONENT_CONFIG_SCHEMA`` + ``check_unique_id`` (a component
  with more than ``platform`` needs ``unique_id``), ``MQTT_ENTITY_COMMON_SCHEMA``.
- ``homeassistant/components/mqtt/abbreviations.py`` (the abbreviations below), ``const.py``
  (``SUPPORTED_COMPONENTS``, ``AVAILABILITY_MODES``), ``util.py`` (``valid_topic``, ``valid_subscribe_topic``,
  ``valid_publish_topic``, ``_VALID_QOS_SCHEMA``), ``config.py`` (``MQTT_RO_SCHEMA``: ``state_topic`` required;
  ``MQTT_RW_SCHEMA``: ``command_topic`` required), ``sensor.py`` (``validate_sensor_state_and_device_class_config``),
  ``binary_sensor.py``, ``switch.py``, ``button.py`` (their ``DISCOVERY_SCHEMA``).
- ``homeassistant/components/sensor/const.py``: ``SensorDeviceClass``, ``SensorStateClass``, ``DEVICE_CLASS_UNITS``,
  ``DEVICE_CLASS_STATE_CLASSES``, ``NON_NUMERIC_DEVICE_CLASSES``; ``sensor/__init__.py``: ``SensorEntity.state``
  (a unit on a non-numeric class raises; a unit or state class the device class does not allow is logged as a
  warning) and ``async_internal_added_to_hass`` (entity category ``config`` raises; same in ``binary_sensor``).
- ``homeassistant/const.py`` (``UnitOf*``, ``PERCENTAGE`` and the other unit constants, ``EntityCategory``),
  ``homeassistant/components/{binary_sensor,button,switch}/__init__.py`` (their ``*DeviceClass``),
  ``homeassistant/helpers/entity_platform.py`` (a second entity with the same ``(domain, "mqtt", unique_id)`` is
  ignored), ``homeassistant/helpers/config_validation.py`` (``string``, ``ensure_list``, ``configuration_url``).

Documentation (home-assistant/home-assistant.io): ``source/_integrations/mqtt.markdown`` at
0a314403e71f72c2fa6fdcb51b28d4876b4ab7c2 ("Device discovery payload": the example used by the tests; ``unique_id``
required for entity components), ``source/_integrations/sensor.mqtt.markdown`` at
9e4a69ab998700a518e366a7f54551a150fccf94 (``options``; ``entity_category`` must be ``diagnostic`` for sensors).

Later releases only add: in 2025.4.4 (checked the same way) sensors gain the device classes ``area``,
``blood_glucose_concentration``, ``energy_distance``, ``wind_direction`` and the state class ``measurement_angle``;
``duration`` also allows ``μs``; ``energy``/``energy_storage``/``power``/``voltage``/``volume_flow_rate`` allow more
units; and MQTT warns that a unit the device class does not allow "will stop working in HA Core 2025.7.0". A payload
valid here is therefore valid there too.

Each problem is ``"<where>: <what>"``. Without a tag, Home Assistant 2024.11 rejects it (the whole payload, the
component, or the entity's state). ``(HA warning)``: Home Assistant only logs a warning. ``(edgefl rule ...)``: not a
Home Assistant check. Not covered: ``migrate_discovery`` payloads, platforms other than the four edgefl uses, and
anything that needs more than one message (e.g. unique_id clashes with other devices).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "BINARY_SENSOR_DEVICE_CLASSES",
    "BUTTON_DEVICE_CLASSES",
    "DEVICE_CLASS_STATE_CLASSES",
    "DISCOVERY_TOPIC_RE",
    "ENTITY_CATEGORIES",
    "SENSOR_DEVICE_CLASSES",
    "SENSOR_DEVICE_CLASSES_ANY_UNIT",
    "SENSOR_DEVICE_CLASS_NAMES",
    "SENSOR_STATE_CLASSES",
    "SWITCH_DEVICE_CLASSES",
    "VALID_ID_RE",
    "discovery_topic_re",
    "validate_clear",
    "validate_device_discovery",
]

# --- topics (mqtt/discovery.py TOPIC_MATCHER, verbatim; HA strips "<prefix>/" first) ---------------------------
_TOPIC_MATCHER = r"(?P<component>\w+)/(?:(?P<node_id>[a-zA-Z0-9_-]+)/)?(?P<object_id>[a-zA-Z0-9_-]+)/config"
#: node_id / object_id characters (the same class as in TOPIC_MATCHER and the MQTT docs); use ``fullmatch``.
VALID_ID_RE = re.compile(r"[a-zA-Z0-9_-]+")


def discovery_topic_re(prefix: str = "homeassistant") -> re.Pattern[str]:
    """``<prefix>/<component>/[<node_id>/]<object_id>/config``; anchored at the end because HA subscribes to
    exactly ``<prefix>/<component>/+/config`` and ``<prefix>/<component>/+/+/config``."""
    return re.compile(re.escape(prefix) + "/" + _TOPIC_MATCHER + r"\Z")


#: The discovery topic regex for the default prefix ``homeassistant`` (use ``match``).
DISCOVERY_TOPIC_RE = discovery_topic_re()

# --- abbreviations (mqtt/abbreviations.py; only the entries for keys these four platforms use) ------------------
ABBREVIATIONS = {
    "avty": "availability", "avty_mode": "availability_mode", "avty_t": "availability_topic",
    "avty_tpl": "availability_template", "cmd_t": "command_topic", "cmd_tpl": "command_template",
    "cmps": "components", "dev": "device", "dev_cla": "device_class", "e": "encoding", "en": "enabled_by_default",
    "ent_cat": "entity_category", "ent_pic": "entity_picture", "exp_aft": "expire_after", "frc_upd": "force_update",
    "ic": "icon", "json_attr_t": "json_attributes_topic", "json_attr_tpl": "json_attributes_template",
    "lrst_val_tpl": "last_reset_value_template", "name": "name", "o": "origin", "obj_id": "object_id",
    "off_dly": "off_delay", "ops": "options", "opt": "optimistic", "p": "platform", "pl_avail": "payload_available",
    "pl_not_avail": "payload_not_available", "pl_off": "payload_off", "pl_on": "payload_on",
    "pl_prs": "payload_press", "ret": "retain", "stat_cla": "state_class", "stat_off": "state_off",
    "stat_on": "state_on", "stat_t": "state_topic", "sug_dsp_prc": "suggested_display_precision", "t": "topic",
    "uniq_id": "unique_id", "unit_of_meas": "unit_of_measurement", "val_tpl": "value_template",
}
DEVICE_ABBREVIATIONS = {
    "cns": "connections", "cu": "configuration_url", "ids": "identifiers", "name": "name", "mf": "manufacturer",
    "mdl": "model", "mdl_id": "model_id", "hw": "hw_version", "sw": "sw_version", "sa": "suggested_area",
    "sn": "serial_number",
}
ORIGIN_ABBREVIATIONS = {"name": "name", "sw": "sw_version", "url": "support_url"}

# --- mqtt/schemas.py, mqtt/const.py -----------------------------------------------------------------------------
SHARED_OPTIONS = (
    "availability", "availability_mode", "availability_template", "availability_topic", "command_topic",
    "payload_available", "payload_not_available", "state_topic",
)
#: The only keys DEVICE_DISCOVERY_SCHEMA takes at the root (it is a plain vol.Schema: extra keys are rejected).
_ROOT_KEYS = frozenset({
    "availability_topic", "availability_template", "payload_available", "payload_not_available",
    "availability_mode", "availability", "device", "components", "origin", "state_topic", "command_topic", "qos",
    "encoding",
})
_DEVICE_KEYS = frozenset({
    "identifiers", "connections", "manufacturer", "model", "model_id", "name", "hw_version", "serial_number",
    "sw_version", "via_device", "suggested_area", "configuration_url", "via_hub",  # via_hub: deprecated alias
})
_ORIGIN_KEYS = frozenset({"name", "sw_version", "support_url"})
AVAILABILITY_MODES = frozenset({"all", "any", "latest"})
SUPPORTED_COMPONENTS = frozenset({
    "alarm_control_panel", "binary_sensor", "button", "camera", "climate", "cover", "device_automation",
    "device_tracker", "event", "fan", "humidifier", "image", "lawn_mower", "light", "lock", "notify", "number",
    "scene", "siren", "select", "sensor", "switch", "tag", "text", "update", "vacuum", "valve", "water_heater",
})
#: The platforms this validator checks (the ones edgefl publishes); all four are in mqtt/const.py ENTITY_PLATFORMS.
PLATFORMS = frozenset({"sensor", "binary_sensor", "switch", "button", "select"})

# --- homeassistant/const.py: EntityCategory and the unit enums DEVICE_CLASS_UNITS uses --------------------------
ENTITY_CATEGORIES: set[str] = {"config", "diagnostic"}

PERCENTAGE = "%"
LIGHT_LUX = "lx"
PPM, PPB = "ppm", "ppb"  # CONCENTRATION_PARTS_PER_MILLION / _BILLION
UG_PER_M3 = "µg/m³"  # CONCENTRATION_MICROGRAMS_PER_CUBIC_METER (U+00B5 MICRO SIGN)
UNIT_OF_APPARENT_POWER = {"VA"}
UNIT_OF_PRESSURE = {"Pa", "hPa", "kPa", "bar", "cbar", "mbar", "mmHg", "inHg", "psi"}
UNIT_OF_CONDUCTIVITY = {"S/cm", "µS/cm", "mS/cm"}  # U+00B5
UNIT_OF_ELECTRIC_CURRENT = {"mA", "A"}
UNIT_OF_DATA_RATE = {"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "B/s", "kB/s", "MB/s", "GB/s", "KiB/s", "MiB/s", "GiB/s"}
UNIT_OF_INFORMATION = {
    "bit", "kbit", "Mbit", "Gbit", "B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB",
    "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB",
}
UNIT_OF_LENGTH = {"mm", "cm", "m", "km", "in", "ft", "yd", "mi", "nmi"}
UNIT_OF_ENERGY = {"J", "kJ", "MJ", "GJ", "Wh", "kWh", "MWh", "cal", "kcal", "Mcal", "Gcal"}
UNIT_OF_FREQUENCY = {"Hz", "kHz", "MHz", "GHz"}
UNIT_OF_VOLUME = {"ft³", "CCF", "m³", "L", "mL", "gal", "fl. oz."}
UNIT_OF_IRRADIANCE = {"W/m²", "BTU/(h⋅ft²)"}  # U+22C5 DOT OPERATOR
UNIT_OF_PRECIPITATION_DEPTH = {"in", "mm", "cm"}
UNIT_OF_VOLUMETRIC_FLUX = {"in/d", "in/h", "mm/d", "mm/h"}
UNIT_OF_SOUND_PRESSURE = {"dB", "dBA"}
UNIT_OF_SPEED = {"Beaufort", "ft/s", "in/s", "m/s", "km/h", "kn", "mph", "mm/s"}
UNIT_OF_TEMPERATURE = {"°C", "°F", "K"}
UNIT_OF_ELECTRIC_POTENTIAL = {"mV", "V"}
UNIT_OF_VOLUME_FLOW_RATE = {"m³/h", "ft³/min", "L/min", "gal/min"}
UNIT_OF_MASS = {"g", "kg", "mg", "µg", "oz", "lb", "st"}  # U+00B5

# --- sensor/const.py ---------------------------------------------------------------------------------------------
#: Units per sensor device class: DEVICE_CLASS_UNITS, plus ``{None}`` for NON_NUMERIC_DEVICE_CLASSES (a unit on those
#: raises in SensorEntity.state). ``None`` in a set means "no unit_of_measurement".
SENSOR_DEVICE_CLASSES: dict[str, set[str | None]] = {
    "apparent_power": UNIT_OF_APPARENT_POWER,
    "aqi": {None},
    "atmospheric_pressure": UNIT_OF_PRESSURE,
    "battery": {PERCENTAGE},
    "carbon_monoxide": {PPM},
    "carbon_dioxide": {PPM},
    "conductivity": UNIT_OF_CONDUCTIVITY,
    "current": UNIT_OF_ELECTRIC_CURRENT,
    "data_rate": UNIT_OF_DATA_RATE,
    "data_size": UNIT_OF_INFORMATION,
    "date": {None},
    "distance": UNIT_OF_LENGTH,
    "duration": {"d", "h", "min", "s", "ms"},  # UnitOfTime.DAYS, HOURS, MINUTES, SECONDS, MILLISECONDS
    "energy": UNIT_OF_ENERGY,
    "energy_storage": UNIT_OF_ENERGY,
    "enum": {None},
    "frequency": UNIT_OF_FREQUENCY,
    "gas": {"CCF", "ft³", "m³"},
    "humidity": {PERCENTAGE},
    "illuminance": {LIGHT_LUX},
    "irradiance": UNIT_OF_IRRADIANCE,
    "moisture": {PERCENTAGE},
    "nitrogen_dioxide": {UG_PER_M3},
    "nitrogen_monoxide": {UG_PER_M3},
    "nitrous_oxide": {UG_PER_M3},
    "ozone": {UG_PER_M3},
    "ph": {None},
    "pm1": {UG_PER_M3},
    "pm10": {UG_PER_M3},
    "pm25": {UG_PER_M3},
    "power_factor": {PERCENTAGE, None},
    "power": {"W", "kW"},
    "precipitation": UNIT_OF_PRECIPITATION_DEPTH,
    "precipitation_intensity": UNIT_OF_VOLUMETRIC_FLUX,
    "pressure": UNIT_OF_PRESSURE,
    "reactive_power": {"var"},
    "signal_strength": {"dB", "dBm"},
    "sound_pressure": UNIT_OF_SOUND_PRESSURE,
    "speed": UNIT_OF_SPEED | UNIT_OF_VOLUMETRIC_FLUX,
    "sulphur_dioxide": {UG_PER_M3},
    "temperature": UNIT_OF_TEMPERATURE,
    "timestamp": {None},
    "volatile_organic_compounds": {UG_PER_M3},
    "volatile_organic_compounds_parts": {PPB, PPM},
    "voltage": UNIT_OF_ELECTRIC_POTENTIAL,
    "volume": UNIT_OF_VOLUME,
    "volume_flow_rate": UNIT_OF_VOLUME_FLOW_RATE,
    "volume_storage": UNIT_OF_VOLUME,
    "water": {"CCF", "ft³", "m³", "gal", "L"},
    "weight": UNIT_OF_MASS,
    "wind_speed": UNIT_OF_SPEED,
}
#: Sensor device classes DEVICE_CLASS_UNITS leaves unconstrained (monetary: any ISO 4217 currency, per the docs).
SENSOR_DEVICE_CLASSES_ANY_UNIT: set[str] = {"monetary"}
#: Every SensorDeviceClass value (52 in 2024.11).
SENSOR_DEVICE_CLASS_NAMES = frozenset(SENSOR_DEVICE_CLASSES) | SENSOR_DEVICE_CLASSES_ANY_UNIT
NON_NUMERIC_DEVICE_CLASSES = frozenset({"date", "enum", "timestamp"})
SENSOR_STATE_CLASSES: set[str] = {"measurement", "total", "total_increasing"}

_ALL, _MEAS, _TOTALS = SENSOR_STATE_CLASSES, {"measurement"}, {"total", "total_increasing"}
#: DEVICE_CLASS_STATE_CLASSES: the state classes each sensor device class allows (an empty set: none).
DEVICE_CLASS_STATE_CLASSES: dict[str, set[str]] = {
    **{dc: _MEAS for dc in (
        "apparent_power", "aqi", "atmospheric_pressure", "battery", "carbon_monoxide", "carbon_dioxide",
        "conductivity", "current", "data_rate", "energy_storage", "frequency", "humidity", "illuminance",
        "irradiance", "moisture", "nitrogen_dioxide", "nitrogen_monoxide", "nitrous_oxide", "ozone", "ph", "pm1",
        "pm10", "pm25", "power_factor", "power", "precipitation_intensity", "pressure", "reactive_power",
        "signal_strength", "sound_pressure", "speed", "sulphur_dioxide", "temperature",
        "volatile_organic_compounds", "volatile_organic_compounds_parts", "voltage", "volume_storage",
        "volume_flow_rate", "wind_speed",
    )},
    **{dc: _ALL for dc in ("data_size", "distance", "duration", "precipitation", "weight")},
    **{dc: _TOTALS for dc in ("energy", "gas", "volume", "water")},
    **{dc: set() for dc in ("date", "enum", "timestamp")},
    "monetary": {"total"},
}

# --- binary_sensor / button / switch __init__.py ---------------------------------------------------------------
BINARY_SENSOR_DEVICE_CLASSES: set[str] = {
    "battery", "battery_charging", "carbon_monoxide", "cold", "connectivity", "door", "garage_door", "gas", "heat",
    "light", "lock", "moisture", "motion", "moving", "occupancy", "opening", "plug", "power", "presence", "problem",
    "running", "safety", "smoke", "sound", "tamper", "update", "vibration", "window",
}
BUTTON_DEVICE_CLASSES: set[str] = {"identify", "restart", "update"}
SWITCH_DEVICE_CLASSES: set[str] = {"outlet", "switch"}

_WARN = " (HA warning)"
_OURS = " (edgefl rule, not checked by HA)"


def _expand(conf: dict[str, Any], table: dict[str, str]) -> dict[str, Any]:
    """discovery._replace_abbreviations on a copy: an abbreviated key replaces its long form."""
    out = dict(conf)
    for key in set(table).intersection(conf):
        out[table[key]] = out.pop(key)
    return out


def _ensure_list(value: Any) -> list[Any]:
    """config_validation.ensure_list."""
    return [] if value is None else value if isinstance(value, list) else [value]


def _is_string(value: Any) -> bool:
    """config_validation.string accepts anything but None, lists and dicts."""
    return value is not None and not isinstance(value, (list, dict))


def _valid_qos(value: Any) -> bool:
    """mqtt/util.py _VALID_QOS_SCHEMA: vol.All(vol.Coerce(int), vol.In([0, 1, 2]))."""
    try:
        return int(value) in (0, 1, 2)
    except (TypeError, ValueError):
        return False


def _topic_problem(value: Any, publish: bool) -> str | None:
    """mqtt/util.py valid_topic + valid_publish_topic / valid_subscribe_topic; None when valid."""
    if not _is_string(value):
        return "must be a string"
    topic = str(value)
    try:
        raw = topic.encode("utf-8")
    except UnicodeError:
        return "must be valid UTF-8"
    if not raw:
        return "must not be empty"
    if len(raw) > 65535:
        return "must not be longer than 65535 encoded bytes"
    for char in topic:
        if char <= "\u001f" or "\u007f" <= char <= "\u009f":
            return "must not contain control characters"
        if "\ufdd0" <= char <= "\ufdef" or (ord(char) & 0xFFFF) in (0xFFFE, 0xFFFF):
            return "must not contain non-characters"
    if publish:
        return "wildcards cannot be used in topic names" if "+" in topic or "#" in topic else None
    for i, char in enumerate(topic):
        if char == "+" and ((i > 0 and topic[i - 1] != "/") or (i < len(topic) - 1 and topic[i + 1] != "/")):
            return "single-level wildcard must occupy an entire level of the filter"
    index = topic.find("#")
    if index != -1 and index != len(topic) - 1:
        return "multi-level wildcard must be the last character in the topic filter"
    if index != -1 and len(topic) > 1 and topic[index - 1] != "/":
        return "multi-level wildcard must be after a topic level separator"
    return None


def _check_topic(problems: list[str], where: str, conf: dict[str, Any], key: str, publish: bool) -> None:
    if key in conf and (why := _topic_problem(conf[key], publish)):
        problems.append(f"{where}.{key}: {conf[key]!r} {why}")


def _check_availability(problems: list[str], where: str, conf: dict[str, Any]) -> None:
    """schemas._MQTT_AVAILABILITY_SCHEMA (entries already expanded)."""
    if "availability_topic" in conf and "availability" in conf:
        problems.append(f"{where}: availability_topic and availability are exclusive (either may come from the root)")
    _check_topic(problems, where, conf, "availability_topic", publish=False)
    if "availability_mode" in conf and conf["availability_mode"] not in AVAILABILITY_MODES:
        problems.append(f"{where}.availability_mode: {conf['availability_mode']!r} not in {sorted(AVAILABILITY_MODES)}")
    for i, entry in enumerate(_ensure_list(conf.get("availability"))):
        if not isinstance(entry, dict) or "topic" not in entry:
            problems.append(f"{where}.availability[{i}]: needs a topic ('topic' or 't')")
        else:
            _check_topic(problems, f"{where}.availability[{i}]", entry, "topic", publish=False)


def _url_problem(value: Any) -> str | None:
    """config_validation.configuration_url: scheme http, https or homeassistant, and a host (vol.Url)."""
    parsed = urlparse(str(value))
    ok = parsed.scheme in ("http", "https", "homeassistant") and bool(parsed.netloc)
    return None if ok else f"{value!r} is not an http(s):// or homeassistant:// URL"


def _check_device(problems: list[str], device: Any) -> None:
    """schemas.MQTT_ENTITY_DEVICE_INFO_SCHEMA."""
    if not isinstance(device, dict):
        problems.append("device: a mapping ('dev' or 'device') is required")
        return
    device = _expand(device, DEVICE_ABBREVIATIONS)
    if extra := sorted(set(device) - _DEVICE_KEYS):
        problems.append(f"device: keys not allowed: {extra}")
    if not (device.get("identifiers") or device.get("connections")):
        problems.append("device: needs non-empty identifiers ('ids') and/or connections ('cns')")
    if any(not _is_string(i) for i in _ensure_list(device.get("identifiers"))):
        problems.append("device.identifiers: must be a string or a list of strings")
    for conn in _ensure_list(device.get("connections")):
        if not (isinstance(conn, list) and len(conn) == 2 and all(_is_string(c) for c in conn)):
            problems.append(f"device.connections: {conn!r} is not a [type, id] pair")
    if "configuration_url" in device and (why := _url_problem(device["configuration_url"])):
        problems.append(f"device.configuration_url: {why}")


def _check_origin(problems: list[str], origin: Any) -> None:
    """schemas.MQTT_ORIGIN_INFO_SCHEMA: name required (device discovery requires origin itself)."""
    if not isinstance(origin, dict):
        problems.append("origin: a mapping ('o' or 'origin') with a name is required")
        return
    origin = _expand(origin, ORIGIN_ABBREVIATIONS)
    if not _is_string(origin.get("name")):
        problems.append("origin.name: required")
    if extra := sorted(set(origin) - _ORIGIN_KEYS):
        problems.append(f"origin: keys not allowed: {extra}")
    if "support_url" in origin and (why := _url_problem(origin["support_url"])):
        problems.append(f"origin.support_url: {why}")


def _replace_topic_base(conf: dict[str, Any]) -> None:
    """discovery._replace_topic_base: ``~`` at the start or end of a ``*topic`` value becomes the base."""
    base = conf.pop("~")
    for key, value in conf.items():
        if key.endswith("topic") and isinstance(value, str) and value:
            if value[0] == "~":
                conf[key] = value = f"{base}{value[1:]}"
            if value[-1] == "~":
                conf[key] = f"{value[:-1]}{base}"
    for entry in _ensure_list(conf.get("availability")):
        if isinstance(entry, dict) and (topic := str(entry.get("topic"))):
            if topic[0] == "~":
                entry["topic"] = topic = f"{base}{topic[1:]}"
            if topic[-1] == "~":
                entry["topic"] = f"{topic[:-1]}{base}"


def _check_sensor(problems: list[str], where: str, conf: dict[str, Any]) -> None:
    """mqtt/sensor.py DISCOVERY_SCHEMA + validate_sensor_state_and_device_class_config; sensor/__init__.py state."""
    dc = conf.get("device_class")
    dc = dc.lower() if isinstance(dc, str) else dc  # DEVICE_CLASSES_SCHEMA: vol.Lower, then the enum
    sc = conf.get("state_class")
    sc = sc.lower() if isinstance(sc, str) else sc
    unit, options = conf.get("unit_of_measurement"), conf.get("options")
    if dc is not None and dc not in SENSOR_DEVICE_CLASS_NAMES:
        problems.append(f"{where}.device_class: unknown sensor device class {dc!r}")
        dc = None
    if sc is not None and sc not in SENSOR_STATE_CLASSES:
        problems.append(f"{where}.state_class: unknown state class {sc!r}")
        sc = None
    if "last_reset_value_template" in conf and sc != "total":
        problems.append(f"{where}.last_reset_value_template: needs state_class 'total', not {sc!r}")
    if options is not None:
        if not _ensure_list(options):
            problems.append(f"{where}.options: an empty options list is not allowed")
        if sc or unit:
            problems.append(f"{where}.options: not allowed together with state_class or unit_of_measurement")
        if dc != "enum":
            problems.append(f"{where}.options: needs device_class 'enum', got {dc!r}")
    elif dc == "enum":
        problems.append(f"{where}.options: an enum sensor should list its options{_OURS}")
    if dc in NON_NUMERIC_DEVICE_CLASSES and unit:
        problems.append(f"{where}.unit_of_measurement: {unit!r} on the non-numeric device class {dc!r}")
    elif dc in SENSOR_DEVICE_CLASSES and unit not in SENSOR_DEVICE_CLASSES[dc]:
        allowed = sorted("no unit" if u is None else u for u in SENSOR_DEVICE_CLASSES[dc])
        shown = "no unit" if unit is None else repr(unit)
        problems.append(f"{where}.unit_of_measurement: {shown} is not allowed for device_class {dc!r}: {allowed}"
                        f"{_WARN}")
    if dc and sc and sc not in DEVICE_CLASS_STATE_CLASSES[dc]:
        allowed = sorted(DEVICE_CLASS_STATE_CLASSES[dc]) or "none"
        problems.append(f"{where}.state_class: {sc!r} is not allowed for device_class {dc!r}: {allowed}{_WARN}")


def _check_component(problems: list[str], where: str, platform: str, conf: dict[str, Any]) -> None:
    """The platform's DISCOVERY_SCHEMA (extra keys are dropped, not rejected) on the merged component config."""
    _check_availability(problems, where, conf)
    _check_topic(problems, where, conf, "json_attributes_topic", publish=False)
    category = conf.get("entity_category")
    if "entity_category" in conf and category not in ENTITY_CATEGORIES:
        problems.append(f"{where}.entity_category: {category!r} not in {sorted(ENTITY_CATEGORIES)}")
    elif category == "config" and platform in ("sensor", "binary_sensor"):
        problems.append(f"{where}.entity_category: a {platform} cannot have entity category 'config'")
    if platform in ("sensor", "binary_sensor"):  # config.MQTT_RO_SCHEMA
        if "state_topic" not in conf:
            problems.append(f"{where}.state_topic: required for a {platform} (here or at the payload's root)")
        _check_topic(problems, where, conf, "state_topic", publish=False)
    else:  # switch: config.MQTT_RW_SCHEMA; button: its own schema
        if "command_topic" not in conf:
            problems.append(f"{where}.command_topic: required for a {platform} (here or at the payload's root)")
        _check_topic(problems, where, conf, "command_topic", publish=True)
        if platform in ("switch", "select"):
            _check_topic(problems, where, conf, "state_topic", publish=False)
    classes = {"binary_sensor": BINARY_SENSOR_DEVICE_CLASSES, "button": BUTTON_DEVICE_CLASSES,
               "switch": SWITCH_DEVICE_CLASSES}
    if platform == "sensor":
        _check_sensor(problems, where, conf)
    elif platform == "select":  # mqtt/select.py: options required (a list of strings); no device classes
        options = conf.get("options")
        if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
            problems.append(f"{where}.options: a select needs a non-empty list of strings")
        if "device_class" in conf:
            problems.append(f"{where}.device_class: a select has no device class")
    elif (dc := conf.get("device_class")) is not None and str(dc).lower() not in classes[platform]:
        problems.append(f"{where}.device_class: unknown {platform} device class {dc!r}")


def _check_topic_name(problems: list[str], topic: str, prefix: str) -> None:
    match = discovery_topic_re(prefix).match(topic)
    if match is None:
        problems.append(f"topic: {topic!r} is not {prefix}/device/[<node_id>/]<object_id>/config "
                        "with ids of [a-zA-Z0-9_-]")
    elif match["component"] != "device":
        problems.append(f"topic: component {match['component']!r} is not 'device' (device-based discovery)")


def validate_device_discovery(topic: str, payload: dict, prefix: str = "homeassistant") -> list[str]:
    """The problems Home Assistant 2024.11 would find with this device discovery message (empty: valid)."""
    problems: list[str] = []
    _check_topic_name(problems, topic, prefix)
    if not isinstance(payload, dict):
        return [*problems, "payload: must be a JSON object"]
    root = _expand(payload, ABBREVIATIONS)
    if isinstance(root.get("availability"), (list, dict)):
        root["availability"] = [_expand(e, ABBREVIATIONS) if isinstance(e, dict) else e
                                for e in _ensure_list(root["availability"])]
    if extra := sorted(set(root) - _ROOT_KEYS):
        problems.append(f"payload: keys not allowed at the root of a device payload: {extra}")
    _check_device(problems, root.get("device"))
    _check_origin(problems, root.get("origin"))
    _check_availability(problems, "payload", root)
    _check_topic(problems, "payload", root, "state_topic", publish=False)
    _check_topic(problems, "payload", root, "command_topic", publish=True)
    if "qos" in root and not _valid_qos(root["qos"]):
        problems.append(f"payload.qos: {root['qos']!r} not in 0, 1, 2")
    components = root.get("components")
    if not isinstance(components, dict):
        return [*problems, "components: a mapping ('cmps' or 'components') is required"]
    if not components:
        problems.append(f"components: empty, so nothing is discovered{_OURS}")
    seen: dict[str, tuple[str, str]] = {}  # unique_id -> (platform, component id)
    for cid, raw in components.items():
        where = f"components.{cid}"
        if not VALID_ID_RE.fullmatch(cid):
            problems.append(f"{where}: component id {cid!r} has characters outside [a-zA-Z0-9_-]{_OURS}")
        if not isinstance(raw, dict):
            problems.append(f"{where}: must be a mapping")
            continue
        conf = _expand(raw, ABBREVIATIONS)
        if isinstance(conf.get("availability"), (list, dict)):
            conf["availability"] = [_expand(e, ABBREVIATIONS) if isinstance(e, dict) else e
                                    for e in _ensure_list(conf["availability"])]
        platform = conf.pop("platform", None)
        if platform not in SUPPORTED_COMPONENTS:
            problems.append(f"{where}.platform: {platform!r} is not a supported MQTT platform ('p' or 'platform')")
            continue
        if platform not in PLATFORMS:
            problems.append(f"{where}.platform: {platform!r} is not checked here, only {sorted(PLATFORMS)}{_OURS}")
            continue
        if not conf:  # only a platform: removes that component
            continue
        uid = conf.get("unique_id")
        if not _is_string(uid):
            problems.append(f"{where}.unique_id: required in device discovery ('uniq_id' or 'unique_id')")
        elif (other := seen.setdefault(str(uid), (platform, cid))) != (platform, cid):
            same = other[0] == platform
            problems.append(f"{where}.unique_id: {uid!r} duplicates that of components.{other[1]}"
                            + ("" if same else f" (a {other[0]}){_OURS}"))
        for option in SHARED_OPTIONS:  # discovery._merge_common_device_options
            if option in root and option not in conf:
                conf[option] = root[option]
        if "~" in conf:
            _replace_topic_base(conf)
        _check_component(problems, where, platform, conf)
    return problems


def validate_clear(topic: str, payload: bytes, prefix: str = "homeassistant") -> list[str]:
    """An empty (retained) payload on the device's discovery topic removes the device and its components."""
    problems: list[str] = []
    _check_topic_name(problems, topic, prefix)
    if payload != b"":
        problems.append(f"payload: {payload[:40]!r} is not empty; only an empty payload clears a device")
    return problems
