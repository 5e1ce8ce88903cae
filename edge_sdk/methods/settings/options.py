"""A method's settings are one frozen dataclass: how ``--option key=value`` text becomes it, and back.

A setting is a dataclass field made with :func:`option`: its one default, the parser that reads
its ``--option`` text, one line of help, and whether the device half needs it (``device=True``:
it travels in every plan's ``train`` settings under its wire key). A shared group of settings
(the robust rule, the server optimizer, ``prox_mu``, the widths) is its own dataclass, composed
into a method's with :func:`group`; its keys sit in the same flat ``--option`` namespace.

Everything else is derived from the dataclass, so nothing is written twice:

- :func:`schema`: the :class:`Option` rows (key, parser, default text, help), in declaration order;
- :func:`parse`: ``--option`` text -> an instance (unknown keys: a one-line error listing the known);
- :func:`help_text`: the table ``edgefl simulate --method M --option help`` prints;
- :func:`markdown_table`: the ``## Options`` table of docs/methods/M.md;
- :func:`as_report`: the settings as ``{key: value}`` for the report's ``method_config``;
- :func:`to_wire` / :func:`from_wire`: the device settings in ``plan.train`` and back, on the
  device, into the same dataclass (one default on both halves).

A parser takes ``(key, text)`` and returns the typed value or raises a one-line ValueError that
names the option (``option trim: must be in [0, 0.5), got '0.7'``). Booleans read ``true/false``,
``yes/no``, ``on/off`` and ``1/0`` in any case, everywhere. This module imports neither torch
nor numpy: the CLI's ``--option help`` and a device without torch read it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Iterator, Mapping

__all__ = ["Parser", "Option", "Schema", "option", "group", "schema", "parse", "help_text", "markdown_table",
           "as_report", "to_wire", "from_wire", "boolean", "number", "integer", "choice", "int_list", "text",
           "unknown_keys", "option_pairs"]

#: ``(key, text) -> value``; ValueError names the key.
Parser = Callable[[str, str], Any]

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_OPTION = "edgefl.option"  # field metadata keys
_GROUP = "edgefl.group"


# ----------------------------------------------------------------- parsers
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


def text(key: str, value: str) -> str | None:
    """Any text; empty: None (e.g. a folder that is not set)."""
    return value or None


def unknown_keys(method: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """ValueError listing the known keys when ``options`` has any other."""
    known = set(known)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{method}: unknown option(s) {unknown}; known: {sorted(known)}")


# ----------------------------------------------------------------- declaring settings
@dataclass(frozen=True)
class _Meta:
    parse: Parser | None
    help: str
    key: str | None
    device: bool
    wire: str | None
    none: str | None
    literal: bool
    doc: str | None
    doc_default: str | None


@dataclass(frozen=True)
class _Group:
    cls: type
    defaults: tuple[tuple[str, Any], ...]
    row: str | None


def option(default: Any, parse: Parser | None = None, help: str = "", *, key: str | None = None,
           device: bool = False, wire: str | None = None, none: str | None = None, literal: bool = True,
           doc: str | None = None, doc_default: str | None = None) -> Any:
    """A setting: a dataclass field with its one ``default`` and what the derived views need.

    ``parse`` reads its ``--option`` text (None: not an option, e.g. a device-only plan key);
    ``help`` is one line for ``--option help``; ``key`` its ``--option`` key when not the field's
    name; ``device``: the device half reads it from ``plan.train``, under ``wire`` (default: the
    key); ``none``: the option text that means None (``auto``, ``exact``: shown as the default and
    in the report); ``literal=False``: the default is not one value (it depends on other keys; the
    help says what it is), so ``--option help`` shows ``-``; ``doc``/``doc_default``: the docs
    table's meaning and default cells when they say more than ``help`` and the value.
    """
    if isinstance(default, (list, dict, set)):
        raise TypeError("a setting's default must be immutable (a tuple, not a list)")
    meta = _Meta(parse, help, key, device, wire, none, literal, doc, doc_default)
    return field(default=default, metadata={_OPTION: meta})


def group(cls: type, *, row: str | None = None, **defaults: Any) -> Any:
    """A shared group of settings (a settings dataclass) composed into another: its keys join the
    flat ``--option`` namespace. ``defaults`` change the group's defaults for this method;
    ``row``: the docs table shows the group as one row with this meaning (else one row per key)."""
    return field(default_factory=functools.partial(cls, **defaults),
                 metadata={_GROUP: _Group(cls, tuple(defaults.items()), row)})


@dataclass(frozen=True)
class Option:
    """One ``--option`` key of a settings class, derived from its field.

    ``default`` is the text that means the same as leaving the key out, or None when the default
    is not one value (it depends on the model family or another key; ``help`` says what it is).
    """

    key: str
    parse: Parser
    default: str | None
    help: str
    #: attribute names from the settings object down to the field (groups first)
    path: tuple[str, ...] = ()
    #: the plan.train key the device reads it from (None: the device does not need it)
    wire: str | None = None


class Schema:
    """The options of a settings class, in declaration order (read-only; see :func:`schema`)."""

    def __init__(self, rows: Iterable[Option] = ()) -> None:
        self._rows: dict[str, Option] = {}
        for row in rows:
            if row.key in self._rows:
                raise ValueError(f"option {row.key!r} declared twice")
            self._rows[row.key] = row

    def __iter__(self) -> Iterator[Option]:
        return iter(self._rows.values())

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __getitem__(self, key: str) -> Option:
        return self._rows[key]

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key, in order."""
        return tuple(self._rows)


@dataclass(frozen=True)
class _Leaf:
    name: str
    meta: _Meta
    path: tuple[str, ...]
    default: Any  # in the default settings (a group's defaults for this method applied)

    @property
    def key(self) -> str:
        return self.meta.key or self.name

    @property
    def wire(self) -> str:
        return self.meta.wire or self.key


def _leaves(cls: type, instance: Any, path: tuple[str, ...] = ()) -> Iterator[_Leaf]:
    for f in fields(cls):
        if _GROUP in f.metadata:
            yield from _leaves(f.metadata[_GROUP].cls, getattr(instance, f.name), path + (f.name,))
        elif _OPTION in f.metadata:
            yield _Leaf(f.name, f.metadata[_OPTION], path + (f.name,), getattr(instance, f.name))


@functools.lru_cache(maxsize=None)
def _all_leaves(cls: type) -> tuple[_Leaf, ...]:
    return tuple(_leaves(cls, cls()))


def _show(value: Any, meta: _Meta) -> str | None:
    """``value`` as the option text that parses to it (None: no one text)."""
    if value is None:
        return meta.none
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(":".join(_show(v, meta) or "" for v in item) if isinstance(item, tuple)
                        else _show(item, meta) or "" for item in value)
    return str(value)


@functools.lru_cache(maxsize=None)
def schema(cls: type) -> Schema:
    """The ``--option`` rows of settings class ``cls`` (its groups' keys included)."""
    rows = []
    for leaf in _all_leaves(cls):
        if leaf.meta.parse is None:
            continue
        default = _show(leaf.default, leaf.meta) if leaf.meta.literal else None
        rows.append(Option(leaf.key, leaf.meta.parse, default, leaf.meta.help, leaf.path,
                           leaf.wire if leaf.meta.device else None))
    return Schema(rows)


def _build(cls: type, values: Mapping[tuple[str, ...], Any], path: tuple[str, ...] = (),
           base: Mapping[str, Any] | None = None) -> Any:
    """An instance of ``cls`` from the values given by path (the rest: the defaults)."""
    kwargs = dict(base or {})
    for f in fields(cls):
        here = path + (f.name,)
        if _GROUP in f.metadata:
            spec = f.metadata[_GROUP]
            if any(p[:len(here)] == here for p in values):
                kwargs[f.name] = _build(spec.cls, values, here, dict(spec.defaults))
        elif here in values:
            kwargs[f.name] = values[here]
    return cls(**kwargs)


def _prefixed(method: str, exc: ValueError) -> ValueError:
    message = str(exc)
    return ValueError(message if not method or message.startswith(f"{method}: ") else f"{method}: {message}")


def parse(cls: type, method: str, options: Mapping[str, Any]) -> Any:
    """Settings ``cls`` from ``--option`` text: unknown keys and bad values raise a one-line
    ValueError starting with ``method``; a key left out keeps its default.

    A settings class (or group) with a method ``given(method, keys)`` is told afterwards which of
    its keys were given (e.g. to warn about a hyper-parameter that does nothing)."""
    rows = schema(cls)
    values = check_options(cls, method, options)
    try:
        settings = _build(cls, values)
    except ValueError as exc:
        raise _prefixed(method, exc) from None
    _tell_given(settings, {rows[key].path for key in options}, method)
    return settings


def check_options(cls: type, method: str, options: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """Each ``--option`` of settings ``cls`` parsed on its own (unknown keys and bad values: a
    one-line ValueError starting with ``method``), by path; nothing built, nothing logged."""
    rows = schema(cls)
    unknown_keys(method, options, rows.keys)
    try:
        return {rows[key].path: rows[key].parse(key, str(value).strip()) for key, value in options.items()}
    except ValueError as exc:
        raise _prefixed(method, exc) from None


def _tell_given(settings: Any, given: set[tuple[str, ...]], method: str, path: tuple[str, ...] = ()) -> None:
    mine = set()
    for f in fields(settings):
        if _GROUP in f.metadata:
            _tell_given(getattr(settings, f.name), given, method, path + (f.name,))
        elif path + (f.name,) in given:
            mine.add(f.metadata[_OPTION].key or f.name)
    if mine and hasattr(settings, "given"):
        settings.given(method, mine)


def help_text(cls: type, method: str, doc: str = "") -> str:
    """The table ``--option help`` prints: key, default (``-``: none, or see the help), help."""
    rows = list(schema(cls))
    width = max((len(row.key) for row in rows), default=0)
    shown = [row.default or "-" for row in rows]
    dwidth = min(max((len(d) for d in shown), default=0), 24)
    lines = [f"{method} options (--option KEY=VALUE{'; ' + doc if doc else ''}):"]
    lines += [f"  {row.key:<{width}}  {d:<{dwidth}}  {row.help}" for row, d in zip(rows, shown, strict=True)]
    return "\n".join(lines)


def _doc_default(leaf: _Leaf) -> str:
    if leaf.meta.doc_default is not None:
        return leaf.meta.doc_default
    value = _show(leaf.default, leaf.meta)
    if value is None or value == "":
        return "—"
    if isinstance(leaf.default, (int, float)) and not isinstance(leaf.default, bool):
        return value
    return f"`{value}`"


def _doc_rows(cls: type, instance: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[list[_Leaf], str]]:
    for f in fields(cls):
        if _GROUP in f.metadata:
            spec = f.metadata[_GROUP]
            inner = getattr(instance, f.name)
            if spec.row is not None:
                leaves = [leaf for leaf in _leaves(spec.cls, inner, path + (f.name,)) if leaf.meta.parse is not None]
                yield leaves, spec.row
            else:
                yield from _doc_rows(spec.cls, inner, path + (f.name,))
        elif _OPTION in f.metadata and f.metadata[_OPTION].parse is not None:
            meta = f.metadata[_OPTION]
            yield [_Leaf(f.name, meta, path + (f.name,), getattr(instance, f.name))], meta.doc or meta.help


def markdown_table(cls: type) -> str:
    """The docs' ``## Options`` table of settings ``cls``: one row per key, or per group that
    asks for one (``group(..., row=...)``): keys, defaults, meaning."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for leaves, meaning in _doc_rows(cls, cls()):
        keys = ", ".join(f"`{leaf.key}`" for leaf in leaves)
        defaults = ", ".join(_doc_default(leaf) for leaf in leaves)
        lines.append(f"| {keys} | {defaults} | {meaning} |")
    return "\n".join(lines)


def _plain(value: Any, meta: _Meta) -> Any:
    if value is None:
        return meta.none
    if isinstance(value, tuple):
        return [_plain(v, meta) for v in value]
    return value


def as_report(settings: Any) -> dict[str, Any]:
    """``{key: value}`` of every option (JSON values: lists for tuples, the ``none`` text for None):
    what the report's ``method_config`` records, the same keys ``--option`` takes."""
    out = {}
    for leaf in _leaves(type(settings), settings):
        if leaf.meta.parse is not None:
            out[leaf.key] = _plain(leaf.default, leaf.meta)
    return out


def to_wire(settings: Any) -> dict[str, Any]:
    """The settings the device half needs, as ``plan.train`` entries (wire key -> value)."""
    return {leaf.wire: leaf.default for leaf in _leaves(type(settings), settings) if leaf.meta.device}


def _wire_ok(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return type(value) is type(default)
    if isinstance(default, (int, float)):
        return type(value) in (int, float) and math.isfinite(value)
    return default is None or isinstance(value, type(default))


def _wire_text(value: Any) -> str:
    """A plan value as the option text its parser reads (``str`` of a float round-trips it)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def from_wire(cls: type, method: str, train: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """On the device: settings ``cls`` from a plan's ``train`` entries (the device settings that
    are there; the others keep their defaults, the same the coordinator has), and the entries left.

    A value must have its default's type (a bool stays a bool, a number a finite number) and pass
    the setting's parser (its range), else a one-line ValueError naming ``method`` and the key.
    """
    rest = dict(train)
    values: dict[tuple[str, ...], Any] = {}
    for leaf in _all_leaves(cls):
        if not leaf.meta.device or leaf.wire not in rest:
            continue
        value = rest.pop(leaf.wire)
        if not _wire_ok(value, leaf.default):
            raise ValueError(f"{method}: {leaf.wire} must be like {leaf.default!r}, got {value!r}")
        if leaf.meta.parse is not None and value is not None:
            try:
                value = leaf.meta.parse(leaf.wire, _wire_text(value))
            except ValueError as exc:
                raise _prefixed(method, exc) from None
        values[leaf.path] = value
    try:
        return _build(cls, values), rest
    except ValueError as exc:
        raise _prefixed(method, exc) from None
