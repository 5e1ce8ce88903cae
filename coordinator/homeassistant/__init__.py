"""The fleet in Home Assistant: MQTT device-based discovery, state and a pause switch published
by the coordinator (docs/homeassistant.md)."""

from coordinator.homeassistant.bridge import HomeAssistantBridge
from coordinator.homeassistant.config import HomeAssistantConfig, homeassistant_from_toml

__all__ = ["HomeAssistantBridge", "HomeAssistantConfig", "homeassistant_from_toml"]
