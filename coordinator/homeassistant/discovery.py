"""Home Assistant's device-based MQTT discovery (Home Assistant >= 2024.11) for one edgefl job:
the topics, and the config payload of the coordinator and of each device. The entities read JSON
state that the coordinator publishes on edgefl's own topics (`HaTopics`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from coordinator.homeassistant.names import entity_slug, clean_text, ha_id

from coordinator.core.health import HEALTH_STATES
from edge_sdk.protocol.topics import Topics

__all__ = ["HaTopics", "JOB_STATES", "PAUSE", "RESUME", "coordinator_config", "device_config",
           "serving_components"]

#: The coordinator's job states, in the order a job passes them.
JOB_STATES = ("idle", "waiting_for_devices", "training", "waiting_for_data", "paused", "finished", "interrupted")
#: The pause switch's command payloads (the only ones the coordinator accepts).
PAUSE, RESUME = "pause", "resume"
_ORIGIN = "edgefl"


@dataclass(frozen=True)
class HaTopics:
    """Where one job's Home Assistant messages go: discovery under ``prefix``, state, availability
    and the one command topic under ``edgefl/<job>/ha``."""

    job: str
    prefix: str = "homeassistant"
    root: str = "edgefl"

    @property
    def base(self) -> str:
        return f"{self.root}/{self.job}/ha"

    @property
    def command(self) -> str:
        return f"{self.base}/command"

    @property
    def coordinator_state(self) -> str:
        return f"{self.base}/coordinator/state"

    @property
    def coordinator_availability(self) -> str:
        return f"{self.base}/coordinator/availability"

    def device_state(self, device: str) -> str:
        return f"{self.base}/device/{device}/state"

    def device_availability(self, device: str) -> str:
        return f"{self.base}/device/{device}/availability"

    @property
    def coordinator_node(self) -> str:
        """The coordinator's Home Assistant device id: one per job, stable across restarts."""
        return ha_id(f"edgefl-job-{self.job}")

    @staticmethod
    def device_node(device: str) -> str:
        """A device's Home Assistant device id: the same in every job and run."""
        return ha_id(f"edgefl-dev-{device}")

    def discovery(self, node: str) -> str:
        return f"{self.prefix}/device/{node}/config"


def _origin(version: str) -> dict[str, str]:
    return {"name": _ORIGIN, "sw": version}


def _sensor(node: str, key: str, name: str, state_topic: str, field: str, **extra: Any) -> dict[str, Any]:
    return {"p": "sensor", "unique_id": f"{node}_{key}", "name": name, "state_topic": state_topic,
            "value_template": f"{{{{ value_json.{field} }}}}", **extra}


def _bytes(node: str, key: str, name: str, topic: str, field: str) -> dict[str, Any]:
    return _sensor(node, key, name, topic, field, device_class="data_size", unit_of_measurement="B",
                   state_class="total_increasing")


def _percent(node: str, key: str, name: str, topic: str, template: str) -> dict[str, Any]:
    return {"p": "sensor", "unique_id": f"{node}_{key}", "name": name, "state_topic": topic,
            "value_template": template, "unit_of_measurement": "%", "state_class": "measurement",
            "suggested_display_precision": 1}


def _with_entity_ids(components: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each component's entity id set from its unique id, not left to the order of discovery: as
    ``default_entity_id`` (Home Assistant 2025.10 on) and ``object_id`` (before; dropped by later
    releases)."""
    for component in components.values():
        slug = entity_slug(component["unique_id"])
        component.update(object_id=slug, default_entity_id=f"{component['p']}.{slug}")
    return components


def coordinator_config(topics: HaTopics, *, name: str, method: str, version: str,
                       accuracy_labels: tuple[str, ...] = (), federated_labels: tuple[str, ...] = ()) -> dict[str, Any]:
    """The coordinator's discovery payload: the job's state, rounds, accuracy per model label
    (central and federated, as far as the job has them), bytes, devices online, the last round's
    duration and a switch that pauses the job after its current round."""
    node, state = topics.coordinator_node, topics.coordinator_state
    components: dict[str, dict[str, Any]] = {
        "job_state": _sensor(node, "job_state", "Job state", state, "state", device_class="enum",
                             options=list(JOB_STATES)),
        "round": _sensor(node, "round", "Round", state, "round", state_class="measurement"),
        "version": _sensor(node, "version", "Model version", state, "version", state_class="measurement",
                           icon="mdi:source-branch"),
        "published_version": _sensor(node, "published_version", "Published version", state, "published_version",
                                     state_class="measurement", icon="mdi:publish"),
        "rounds": _sensor(node, "rounds", "Rounds in all", state, "rounds", entity_category="diagnostic"),
        "devices_online": _sensor(node, "devices_online", "Devices online", state, "devices_online",
                                  state_class="measurement"),
        "bytes_down": _bytes(node, "bytes_down", "Bytes down", state, "bytes_down"),
        "bytes_up": _bytes(node, "bytes_up", "Bytes up", state, "bytes_up"),
        "round_duration": _sensor(node, "round_duration", "Last round duration", state, "round_seconds",
                                  device_class="duration", unit_of_measurement="s", state_class="measurement"),
        "health": _sensor(node, "health", "Health", state, "health", device_class="enum", options=list(HEALTH_STATES),
                          entity_category="diagnostic", icon="mdi:harddisk", json_attributes_topic=state,
                          json_attributes_template="{{ {'problem': value_json.health_problem, "
                                                   "'since': value_json.health_since} | tojson }}"),
        "paused": {"p": "switch", "unique_id": f"{node}_paused", "name": "Pause after this round",
                   "command_topic": topics.command, "payload_on": PAUSE, "payload_off": RESUME,
                   "state_topic": state, "state_on": PAUSE, "state_off": RESUME,
                   "value_template": f"{{{{ '{PAUSE}' if value_json.paused else '{RESUME}' }}}}",
                   "icon": "mdi:pause-circle-outline"},
    }
    for kind, field, labels in (("accuracy", "accuracy", accuracy_labels),
                                ("federated_accuracy", "federated_accuracy", federated_labels)):
        title = "Accuracy" if kind == "accuracy" else "Federated accuracy"
        for label in labels:
            key = f"{kind}_{ha_id(label)}"
            # .get: None (unknown in Home Assistant, no template warning) until the label has a figure
            components[key] = _percent(node, key, f"{title} {label}", state,
                                       f"{{{{ value_json.{field}.get({json.dumps(label)}) }}}}")
            if kind == "federated_accuracy":  # what the figure rests on: samples, devices, interval, note
                components[key].update(json_attributes_topic=state, json_attributes_template=(
                    f"{{{{ value_json.get('federated', {{}}).get({json.dumps(label)}, {{}}) | tojson }}}}"))
    return {
        "dev": {"ids": [node], "name": name, "mf": _ORIGIN, "mdl": f"coordinator ({method})", "sw": version},
        "o": _origin(version),
        "cmps": _with_entity_ids(components),
        "availability": [{"topic": topics.coordinator_availability}],
        "qos": 1,
    }


def serving_components(topics: HaTopics, device: str, classes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """A serving device's entities (docs/serving.md): its latest prediction (an enum of the task's
    classes, always one of them or unknown), its confidence, the end of the window it classified, and
    a select that corrects it. They read what the device publishes itself and follow its serving
    connection alone: a device serves while the coordinator is down."""
    node = topics.device_node(device)
    edgefl = Topics(job=topics.job, root=topics.root)
    state, available = edgefl.prediction(device), [{"topic": edgefl.serving_availability(device)}]
    names = json.dumps(list(classes))
    prediction_id = f"{node}_prediction"
    own = {"state_topic": state, "availability": available}
    components = {
        "prediction": {"p": "sensor", "unique_id": prediction_id, "name": "Prediction", "device_class": "enum",
                       "options": list(classes), **own, "icon": "mdi:crystal-ball",
                       "value_template": (f"{{% set c = value_json.get('class') %}}"
                                          f"{{{{ c if c in {names} else None }}}}"),
                       "json_attributes_topic": state, "json_attributes_template": (
                           "{{ {'top': value_json.top, 'start': value_json.start, 'end': value_json.end, "
                           "'version': value_json.version, 'model': value_json.model} | tojson }}")},
        "confidence": _percent(node, "confidence", "Confidence", state,
                               "{{ (100 * value_json.probability) | round(1) }}") | {"availability": available},
        "last_prediction": {"p": "sensor", "unique_id": f"{node}_last_prediction", "name": "Last prediction",
                            "device_class": "timestamp", **own, "value_template": "{{ value_json.end }}"},
        "correct": {"p": "select", "unique_id": f"{node}_correct", "name": "Correct the last prediction",
                    "options": list(classes), "command_topic": edgefl.correction(device),
                    # the corrected prediction named by its window's end, so a correction meets one prediction
                    "command_template": ("{{ {'class': value, 'end': state_attr('sensor."
                                         f"{entity_slug(prediction_id)}', 'end')}} | tojson }}}}"),
                    "state_topic": edgefl.correction_state(device), "availability": available,
                    "icon": "mdi:pencil"},
    }
    return components


def device_config(topics: HaTopics, device: str, *, model: str, sdk_version: str, version: str,
                  serving: tuple[str, ...] = ()) -> dict[str, Any]:
    """A device's discovery payload: its connectivity, the model it was assigned (width, rank or
    level), the last round it trained, its local accuracy (federated evaluation), bytes, measured
    GFLOPS and SDK version. Its entities are available while the coordinator is and, except its
    connectivity, while the device is online too. ``serving``: the task's class names when the
    device serves its model (`serving_components`)."""
    node, state = topics.device_node(device), topics.device_state(device)
    coordinator = {"topic": topics.coordinator_availability}
    components = {
        "online": {"p": "binary_sensor", "unique_id": f"{node}_online", "name": "Online",
                   "device_class": "connectivity", "state_topic": state,
                   "value_template": "{{ 'ON' if value_json.online else 'OFF' }}",
                   "availability": [coordinator]},
        "model": _sensor(node, "model", "Assigned model", state, "label", icon="mdi:tune-variant"),
        "last_round": _sensor(node, "last_round", "Last round trained", state, "last_round",
                              state_class="measurement"),
        "accuracy": _percent(node, "accuracy", "Local accuracy", state, "{{ value_json.accuracy }}"),
        "bytes_down": _bytes(node, "bytes_down", "Bytes down", state, "bytes_down"),
        "bytes_up": _bytes(node, "bytes_up", "Bytes up", state, "bytes_up"),
        "gflops": _sensor(node, "gflops", "Measured GFLOPS", state, "gflops", unit_of_measurement="GFLOPS",
                          state_class="measurement", entity_category="diagnostic"),
        "sdk_version": _sensor(node, "sdk_version", "SDK version", state, "sdk_version",
                               entity_category="diagnostic"),
    }
    if serving:
        components.update(serving_components(topics, device, serving))
    sdk = clean_text(sdk_version, "SDK version", device) or "unknown"
    return {
        "dev": {"ids": [node], "name": clean_text(device, "name", device), "mf": _ORIGIN,
                "mdl": clean_text(model, "model", device) or "edge device", "sw": sdk,
                "via_device": topics.coordinator_node},
        "o": _origin(version),
        "cmps": _with_entity_ids(components),
        "availability": [coordinator, {"topic": topics.device_availability(device)}],
        "availability_mode": "all",
        "qos": 1,
    }
