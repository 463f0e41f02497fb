"""The base of every report record: a frozen dataclass that writes its JSON (``to_dict``) and
states its JSON Schema through its annotations (issue 35).

A record's fields are its JSON keys, in order. A field's annotation gives its JSON type
(``int`` -> integer, ``float | None`` -> number or null, ``tuple[Row, ...]`` -> array of Row
objects, ``dict[str, Stats]`` -> an object of Stats values, a record -> its object);
:func:`fact` adds what a type cannot say: a description, bounds (``minimum=0``), an
``enum``, a field that may be left out of the document (``optional=True``), or a schema
fragment of its own (``schema={...}``) where the value takes several shapes. A record class
states its object's extras in class variables: ``DEF`` (published once under ``$defs``
and referenced), ``CLOSED`` (``additionalProperties: false``), ``EXTRA`` (the schema of
keys beyond its fields), ``SCHEMA`` (more keywords: ``allOf``, ``description``) and ``USES``
(the types whose ``$defs`` those keywords refer to).
``Named("number_or_null")`` in an ``Annotated[...]`` publishes a plain type under ``$defs``.

:mod:`inspect_model.schemas.generate` turns a command's report record (``report=`` on its
registry entry) into the published ``schemas/<command>.json``; nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, ClassVar


class _Absent:
    """The value of an optional field that is left out of the document."""

    _instance: ClassVar[_Absent | None] = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


#: An optional field's default: the key is not written.
ABSENT: Any = _Absent()


@dataclasses.dataclass(frozen=True)
class Named:
    """In ``Annotated[T, Named("x")]``: publish T's schema once as ``$defs.x`` and refer to it."""

    name: str


def fact(default: Any = dataclasses.MISSING, *, doc: str | None = None, optional: bool = False,
         schema: dict[str, Any] | None = None, key: str | None = None, **keywords: Any) -> Any:
    """A record field with what its annotation cannot say (see the module docstring):
    ``doc`` (its description), ``optional`` (the key may be absent: default :data:`ABSENT`),
    ``schema`` (the field's whole schema, in place of its annotation's) and JSON Schema
    ``keywords`` (``minimum``, ``maximum``, ``enum``, ``const``, ``minItems``...); ``key``: the
    JSON key where it is no Python name (``class_ = fact(key="class")``)."""
    meta = {"doc": doc, "optional": optional, "schema": schema, "keywords": keywords, "key": key}
    if optional and default is dataclasses.MISSING:
        default = ABSENT
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_SCALARS = frozenset({float, int, str, bool, type(None)})


def plain(value: Any) -> Any:
    """``value`` as JSON data: records by their ``to_dict``, tuples as lists."""
    if type(value) in _SCALARS:  # most values (a layer's channel means): no isinstance walk
        return value
    if type(value) is list and all(type(v) in _SCALARS for v in value):
        return list(value)
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    """A report record (see the module docstring). Subclasses are frozen keyword-only dataclasses."""

    DEF: ClassVar[str | None] = None
    CLOSED: ClassVar[bool] = False
    EXTRA: ClassVar[Any] = None
    SCHEMA: ClassVar[dict[str, Any]] = {}
    USES: ClassVar[tuple[Any, ...]] = ()  # types whose $defs a raw schema part refers to

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field by name, optional ones left out while :data:`ABSENT`."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is ABSENT:
                continue
            out[f.metadata.get("key") or f.name] = plain(value)
        return out

    def fields(self) -> dict[str, Any]:
        """The field values by Python name, unconverted (to build a wider record from this one)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The JSON keys, in order."""
        return tuple(key(f) for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The record of a JSON object (what :meth:`to_dict` writes, or a session's entry):
        nested records made from their objects, keys the record does not name left out, so
        that renderers read typed records (issue 35), also of a resumed run's stored entries."""
        given = {name: _typed(hint, data[k]) for name, k, hint in _field_hints(cls) if k in data}
        return cls(**given)


@functools.lru_cache(maxsize=None)
def _field_hints(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """(field name, JSON key, resolved annotation) of each field of a record class, worked
    out once per class (``typing.get_type_hints`` evaluates every annotation's text again on
    each call: 85% of ``report.txt``'s cost over 64 images)."""
    import typing

    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, key(f), hints[f.name]) for f in dataclasses.fields(cls))


def _typed(annotation: Any, value: Any) -> Any:
    """``value`` (JSON data) as ``annotation`` says: records from their objects, inside lists,
    dicts, ``X | None`` and ``Annotated``; anything else as it is."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _typed(args[0], value)
    if isinstance(annotation, type) and issubclass(annotation, Record):
        return annotation.from_dict(value) if isinstance(value, Mapping) else value
    if origin in (typing.Union, types.UnionType):
        records = [a for a in args if isinstance(a, type) and issubclass(a, Record)]
        return records[0].from_dict(value) if records and isinstance(value, Mapping) else value
    if origin in (list, tuple) and isinstance(value, (list, tuple)) and args:
        return [_typed(args[0], v) for v in value]
    if origin is dict and isinstance(value, Mapping) and len(args) == 2:
        return {k: _typed(args[1], v) for k, v in value.items()}
    return value


def key(f: dataclasses.Field[Any]) -> str:
    """A record field's JSON key."""
    return f.metadata.get("key") or f.name


def record(cls: type) -> type:
    """Class decorator: a frozen keyword-only dataclass (``@record class Row(Record): ...``)."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


@record
class Warning_(Record):
    """One deduplicated warning and how often it came."""

    CLOSED = True
    message: str
    count: int = fact(minimum=1)


@record
class Skipped(Record):
    """An input that was skipped, and why."""

    path: str
    reason: str
