"""Names that enter Home Assistant: edgefl ids mapped to Home Assistant's ids, and strings a
device sent bounded before they enter a payload."""

from __future__ import annotations

import hashlib
import logging
import re

__all__ = ["entity_slug", "ha_id", "clean_text", "MAX_TEXT"]

log = logging.getLogger(__name__)

#: Home Assistant's node, object and component ids: these characters only.
_HA_ID = re.compile(r"[A-Za-z0-9_-]+")
_NOT_HA_ID = re.compile(r"[^A-Za-z0-9_-]")
#: The longest device string (name, model, SDK version) put in a payload.
MAX_TEXT = 64
_PRINTABLE = re.compile(r"[^\x20-\x7e]")
_logged: set[tuple[str, str]] = set()


def ha_id(value: str) -> str:
    """``value`` as a Home Assistant id: unchanged when it is one already; else each other
    character becomes ``_`` and 8 hex digits of its SHA-256 follow, so that ``a.b`` and ``a_b``
    stay two ids, and the same edgefl id maps to the same Home Assistant id on every run."""
    if _HA_ID.fullmatch(value):
        return value
    mapped = f"{_NOT_HA_ID.sub('_', value)}_{hashlib.sha256(value.encode()).hexdigest()[:8]}"
    _once("mapped", value, "Home Assistant id of %r is %r (its ids allow [A-Za-z0-9_-] only)", value, mapped)
    return mapped


def entity_slug(unique_id: str) -> str:
    """The object part of an entity id for ``unique_id``: Home Assistant's entity ids allow
    ``[a-z0-9_]`` only, so any other character becomes ``_`` and 8 hex digits of the unique id's
    SHA-256 follow (``pi-a`` and ``pi_a`` stay two entities, whichever is discovered first)."""
    slug = re.sub(r"[^a-z0-9_]", "_", unique_id.lower())
    return slug if slug == unique_id else f"{slug}_{hashlib.sha256(unique_id.encode()).hexdigest()[:8]}"


def clean_text(value: object, what: str, device: str) -> str:
    """A string from a device (hostile input) for a payload: printable ASCII, at most
    `MAX_TEXT` characters; the first change for each device and field is logged."""
    text = value if isinstance(value, str) else str(value)
    cleaned = _PRINTABLE.sub("?", text)[:MAX_TEXT]
    if cleaned != text:
        _once(what, device, "%s of device %s cut to %d printable characters for Home Assistant", what, device,
              MAX_TEXT)
    return cleaned


def _once(kind: str, key: str, message: str, *args: object) -> None:
    if (kind, key) not in _logged and len(_logged) < 10_000:
        _logged.add((kind, key))
        log.info(message, *args)
