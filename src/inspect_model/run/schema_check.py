"""The per-image entries of a resume state, checked against the command's published report
schema before the session takes them (issue 41).

A session keeps the report's ``images`` as plain dictionaries, so the record check of
:mod:`inspect_model.run.state_check` cannot see into them; the JSON Schema we ship for each
report (``schemas/<command>.json``) can. This is the small subset of draft 2020-12 those
schemas use (``type``, ``properties``, ``required``, ``items``, ``$ref``, ``enum``, ``const``,
``anyOf``/``oneOf``/``allOf``, ``minimum``/``maximum``, ``minItems``/``maxItems``,
``additionalProperties``); a keyword it does not know is skipped, never failed. jsonschema
is no runtime dependency, and this needs none.
"""

from __future__ import annotations

import math
from typing import Any

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, (list, tuple)),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None or (isinstance(v, float) and math.isnan(v)),  # NaN is written as null
}


def check_entries(entries: Any, command: str, where: str) -> None:
    """``ValueError`` naming the first entry (and path) of ``entries`` that does not fit the
    ``images`` items of ``command``'s report schema; nothing when the command has none."""
    from inspect_model.schemas import available, load_schema

    if command not in available():
        return
    root = load_schema(command)
    item = ((root.get("properties") or {}).get("images") or {}).get("items")
    if item is None:
        return
    if not isinstance(entries, list):
        raise ValueError(f"{where} is not a list")
    for i, entry in enumerate(entries):
        problem = _check(entry, item, root, f"{where}[{i}]", 0)
        if problem:
            raise ValueError(problem)


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def _check(value: Any, schema: Any, root: dict[str, Any], where: str, depth: int) -> str | None:
    """The first way ``value`` breaks ``schema``, as a message; None when it fits."""
    if not isinstance(schema, dict) or depth > 64:
        return None
    schema = _resolve(schema, root)
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return f"{where} is a {type(value).__name__}, not {' or '.join(map(str, kinds))}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} is {str(value)[:40]!r}, not one of {schema['enum'][:6]}"
    if "const" in schema and value != schema["const"]:
        return f"{where} is {str(value)[:40]!r}, not {schema['const']!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} is {value}, below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} is {value}, above {schema['maximum']}"
    for key in ("anyOf", "oneOf"):
        if key in schema and all(_check(value, s, root, where, depth + 1) for s in schema[key]):
            return f"{where} fits none of its allowed forms"
    for sub in schema.get("allOf", []):
        problem = _check(value, sub, root, where, depth + 1)
        if problem:
            return problem
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} has no '{key}'"
        extra = schema.get("additionalProperties", True)
        for key, sub in value.items():
            if key in props:
                problem = _check(sub, props[key], root, f"{where}.{key}", depth + 1)
            elif extra is False:
                problem = f"{where} has an unknown key {str(key)[:40]!r}"
            else:
                problem = _check(sub, extra, root, f"{where}[{str(key)[:40]!r}]", depth + 1) \
                    if isinstance(extra, dict) else None
            if problem:
                return problem
    if isinstance(value, (list, tuple)):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{where} has {len(value)} items, fewer than {schema['minItems']}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{where} has {len(value)} items, more than {schema['maxItems']}"
        items = schema.get("items")
        if isinstance(items, dict):
            for i, v in enumerate(value):
                problem = _check(v, items, root, f"{where}[{i}]", depth + 1)
                if problem:
                    return problem
    return None
