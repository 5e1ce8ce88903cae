"""One way to read ``--option key=value`` settings, for every method and the shared option groups.

A parser takes ``(key, text)`` and returns the typed value or raises a one-line ValueError that
names the option (``option trim: must be in [0, 0.5), got '0.7'``). :meth:`Schema.parse` applies a
method's rows to its options, rejecting unknown keys with the list of known ones.
Booleans read ``true/false``, ``yes/no``, ``on/off`` and ``1/0`` in any case, everywhere.

A method declares its options as a :class:`Schema` of :class:`Option` rows (key, parser, default,
one line of help), built from its own rows and the shared groups (width, assignment, robust);
``edgefl simulate --method M --option help`` prints it (:meth:`Schema.help_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

__all__ = ["Parser", "Option", "Schema", "boolean", "number", "integer", "choice", "int_list", "unknown_keys", "option_pairs"]

#: ``(key, text) -> value``; ValueError names the key.
Parser = Callable[[str, str], Any]

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def option_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` (repeated ``--option`` flags) as a dict; ValueError on a pair without a key or ``=``."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def boolean(key: str, text: str) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0; any case)."""
    low = text.strip().lower()
    if low not in _TRUE + _FALSE:
        raise ValueError(f"option {key}: expected true|false, got {text!r}")
    return low in _TRUE


def number(lo: float, hi: float, *, open_hi: bool = False) -> Parser:
    """A finite number in ``[lo, hi]`` (``[lo, hi)`` with ``open_hi``)."""
    def parse(key: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"option {key}: {text!r} is not a number") from None
        if not math.isfinite(value) or not lo <= value <= hi or (open_hi and value == hi):
            raise ValueError(f"option {key}: must be in [{lo:g}, {hi:g}{')' if open_hi else ']'}, got {text!r}")
        return value
    return parse


def integer(lo: int, hi: int | None = None) -> Parser:
    """An integer ``>= lo`` (and ``<= hi`` when given)."""
    def parse(key: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"option {key}: {text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"option {key}: must be {bound}, got {value}")
        return value
    return parse


def choice(*choices: str) -> Parser:
    """One of ``choices`` (exact)."""
    def parse(key: str, text: str) -> str:
        if text not in choices:
            raise ValueError(f"option {key}: must be one of {'|'.join(choices)}, got {text!r}")
        return text
    return parse


def int_list(lo: int) -> Parser:
    """Comma-separated integers ``>= lo`` (e.g. ``512,256``; empty: none)."""
    one = integer(lo)

    def parse(key: str, text: str) -> tuple[int, ...]:
        return tuple(one(key, item.strip()) for item in text.split(",") if item.strip())
    return parse


def unknown_keys(method: str, options: Mapping[str, Any], known: set[str] | Mapping[str, Any]) -> None:
    """ValueError listing the known keys when ``options`` has any other."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{method}: unknown option(s) {unknown}; known: {sorted(known)}")


@dataclass(frozen=True)
class Option:
    """One ``--option`` key: how its text is read, its default and what it does.

    ``default`` is the text that means the same as leaving the key out, or None when the default
    is not one value (it depends on the model family or another key; ``help`` says what it is).
    """

    key: str
    parse: Parser
    default: str | None
    help: str


class Schema:
    """A method's options, in the order they are documented; built from rows and other schemas."""

    def __init__(self, *parts: "Option | Schema") -> None:
        rows: dict[str, Option] = {}
        for part in parts:
            for row in (part if isinstance(part, Schema) else (part,)):
                if row.key in rows:
                    raise ValueError(f"option {row.key!r} declared twice")
                rows[row.key] = row
        self._rows = rows

    def __iter__(self) -> Iterator[Option]:
        return iter(self._rows.values())

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __getitem__(self, key: str) -> Option:
        return self._rows[key]

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key, in order."""
        return tuple(self._rows)

    def only(self, keys: Iterable[str]) -> "Schema":
        """The rows named in ``keys`` (in this schema's order)."""
        wanted = set(keys)
        return Schema(*(row for row in self if row.key in wanted))

    def parse(self, method: str, options: Mapping[str, Any], *, subset: bool = False) -> dict[str, Any]:
        """The given keys' typed values; unknown keys (unless ``subset``: ignored) and bad values
        raise a one-line ValueError starting with ``method`` (when not empty)."""
        if subset:
            options = {k: v for k, v in options.items() if k in self._rows}
        elif method:
            unknown_keys(method, options, self._rows)
        try:
            return {key: self._rows[key].parse(key, str(text).strip()) for key, text in options.items()}
        except ValueError as exc:
            raise ValueError(f"{method}: {exc}" if method else str(exc)) from None

    def help_text(self, method: str, doc: str = "") -> str:
        """The table ``--option help`` prints: key, default (``-``: none, or see the help), help."""
        width = max((len(row.key) for row in self), default=0)
        shown = [row.default or "-" for row in self]
        dwidth = min(max((len(d) for d in shown), default=0), 24)
        lines = [f"{method} options (--option KEY=VALUE{'; ' + doc if doc else ''}):"]
        lines += [f"  {row.key:<{width}}  {d:<{dwidth}}  {row.help}" for row, d in zip(self, shown)]
        return "\n".join(lines)
