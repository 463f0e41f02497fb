"""JSON Schema from Python types: a request field's or a report record's annotation in, its
schema out (issue 35). The rules are :mod:`inspect_model.reports.base`'s: plain types,
``X | None``, ``list``/``tuple``, ``dict[str, X]``, ``Literal`` (an ``enum``), records (their
objects, or a ``$ref`` when they declare ``DEF``), ``Annotated[T, Named("x")]`` (a named
``$defs`` entry) and ``Annotated[T, {...}]`` (keywords added to T's schema). ``defs``
collects the ``$defs`` a document needs; without it named types are written inline.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

_SIMPLE = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def json_type(annotation: Any, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of ``annotation`` (see the module docstring)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return {}
    if origin is typing.Annotated:
        return _annotated(annotation, defs)
    if dataclasses.is_dataclass(annotation):
        return _record_ref(annotation, defs)
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    if origin in (list, tuple):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return {"type": "array", "items": json_type(args[0], defs) if args else {}}
    if origin is dict or annotation is dict:
        args = typing.get_args(annotation)
        value = json_type(args[1], defs) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": value} if value else {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        return _union([json_type(a, defs) for a in typing.get_args(annotation)])
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    return {}  # paths and other objects: recorded as strings or objects, not constrained here


def _annotated(annotation: Any, defs: dict[str, Any] | None) -> dict[str, Any]:
    from inspect_model.reports.base import Named

    base, *extras = typing.get_args(annotation)
    out = json_type(base, defs)
    name = None
    for extra in extras:
        if isinstance(extra, Named):
            name = extra.name
        elif isinstance(extra, dict):
            out = {**out, **extra}
    if name is None or defs is None:
        return out
    defs.setdefault(name, out)
    return {"$ref": f"#/$defs/{name}"}


def _union(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """``X | None`` as one schema: the types listed together when each part is one ``type``
    (with at most one part carrying more keywords, such as ``items``); else ``anyOf``."""
    if all(isinstance(p.get("type"), str) for p in parts) and sum(len(p) > 1 for p in parts) <= 1:
        out: dict[str, Any] = {}
        for p in sorted(parts, key=len, reverse=True):
            out.update({k: v for k, v in p.items() if k != "type"})
        return {"type": [p["type"] for p in parts], **out}
    return {"anyOf": parts}


def _record_ref(cls: Any, defs: dict[str, Any] | None) -> dict[str, Any]:
    name = getattr(cls, "DEF", None)
    if name is None or defs is None:
        return record_schema(cls, defs)
    if name not in defs:
        defs[name] = {}  # a record that holds itself refers to its own entry
        defs[name] = record_schema(cls, defs)
    return {"$ref": f"#/$defs/{name}"}


def field_schema(f: dataclasses.Field[Any], hint: Any, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One field's schema: its annotation's (or ``fact(schema=...)``), then its keywords and doc."""
    meta = f.metadata
    raw = meta.get("schema")
    out = dict(raw) if raw is not None else json_type(hint, defs)
    out.update(meta.get("keywords") or {})
    if meta.get("doc"):
        out["description"] = meta["doc"]
    return out


def _key(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("key") or f.name


def record_schema(cls: Any, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of a frozen record: its fields, their types, those not ``optional``
    required; what its ``to_dict()`` writes."""
    hints = typing.get_type_hints(cls, include_extras=True)  # each class's fields in its own module
    fields = dataclasses.fields(cls)
    out: dict[str, Any] = {"type": "object"}
    out.update(getattr(cls, "SCHEMA", None) or {})
    for used in getattr(cls, "USES", ()):  # named types a raw part ($ref in allOf...) refers to
        json_type(used, defs)
    required = [_key(f) for f in fields if not f.metadata.get("optional")]
    if required:
        out["required"] = required
    out["properties"] = {_key(f): field_schema(f, hints[f.name], defs) for f in fields}
    if getattr(cls, "CLOSED", False):
        out["additionalProperties"] = False
    elif getattr(cls, "EXTRA", None) is not None:
        out["additionalProperties"] = json_type(cls.EXTRA, defs)
    return out
