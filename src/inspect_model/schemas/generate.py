"""The parts of the published JSON Schemas that code declares, generated from that code.

Each command's report schema (``<command>.json``) is published with the package. The
parts that would otherwise be kept twice are written from their one source here:

- ``properties.command.const``: the command's registry name;
- ``properties.options``: the report's ``options`` object, from the command's request
  fields (names and JSON types from their annotations) plus the model and input options
  every image command shares;
- the report body of a command whose entry names its record type (``CommandSpec.report``,
  ``models``): every field of the frozen record, with its type;
- ``$defs.method.enum`` (cam, attention, attributions): the command's method family's
  registry (``CommandSpec.methods``); every method name in the report refers to it;
- ``$defs.input_box`` and ``$defs.image_box`` (cam, guided-backprop): a detection's box in
  model-input pixels and in the original picture's pixels (:data:`BOX_DEFS`).

``python -m inspect_model.schemas.generate --check`` fails when a published file differs
from what this module makes of it (tests/e2e/test_registry.py runs it); ``--write`` rewrites
them. The report bodies stay hand-written and are validated against real reports in the
tests. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: The model and input options every image command's report records (Prepared.options).
SHARED: dict[str, Any] = {
    "model": {"type": "string"},
    "weights": {"type": ["string", "null"]},
    "checkpoint": {"type": ["string", "null"]},
    "device": {"type": "string"},
    "dtype": {"type": "string"},
    "seed": {"type": "integer"},
    "batch_size": {"type": "integer"},
    "inputs": {"type": "object"},
}
SHARED_REQUIRED = ["model", "weights", "checkpoint", "device", "dtype", "seed", "batch_size", "inputs"]

#: Keys a command's report adds beside its request's fields (resolved forms).
EXTRA: dict[str, dict[str, Any]] = {
    "activations": {"selected": {"type": "integer"}},
    "cam": {"layer_specs": {"type": "array", "items": {"type": "string"}},
            # detectors and segmenters (issue 24): the task, and max_detections null for a segmenter
            # and every model's task (issue 42: {"name", "objective"})
            "task": {"anyOf": [{"enum": ["detection", "segmentation"]},
                               {"type": "object", "properties": {"name": {"type": "string"}}}]},
            "max_detections": {"type": ["integer", "null"]}},
    "summary": {"mode": {"enum": ["eval", "train"]}, "input_size": {"type": "array"}},
}
#: Fields whose report form is not their request form.
OVERRIDE: dict[str, dict[str, Any]] = {
    "cam": {"methods": {"type": "array", "items": {"$ref": "#/$defs/method"}},
            "metrics": {"type": ["array", "null"], "items": {"type": "string"}},
            "layers": {"type": "array", "items": {"type": "string"}}},
    "guided-backprop": {"layer": {"type": "string"}, "activations": {"type": "array", "items": {"type": "string"}},
                        "layers": {"type": "array", "items": {"type": "string"}}},
    "activations": {"channels": {"type": ["object", "string", "null"]}},
    "summary": {"input_size": {"type": "array"}},
}
#: Commands whose options are their request alone (no model/input options).
OWN_OPTIONS = {"models"}

_BOX = {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 4, "maxItems": 4}
#: The two frames a detection's box is reported in (``$defs``, referenced by the report bodies
#: of the commands that explain detections): the model input's pixels, where the model found
#: it, and the original picture's pixels, where the pictures draw it and ``--boxes`` gives it.
BOX_DEFS: dict[str, dict[str, Any]] = {
    "input_box": dict(_BOX, description="x0, y0, x1, y1 in model-input pixels (after --resize/--crop or the "
                      "model's own preprocessing)"),
    "image_box": dict(_BOX, description="x0, y0, x1, y1 in the original picture's pixels, as --boxes takes "
                      "them and the pictures draw them (the input box mapped back through the resize and "
                      "crop); null when no picture is known (a tensor input)"),
}


def json_type(annotation: Any) -> dict[str, Any]:
    """The JSON Schema of a request field's or a report record's annotation."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return {}
    if dataclasses.is_dataclass(annotation):
        return record_schema(annotation)
    if origin is list:
        args = typing.get_args(annotation)
        return {"type": "array", "items": json_type(args[0]) if args else {}}
    if origin in (typing.Union, types.UnionType):
        parts = [json_type(a) for a in typing.get_args(annotation)]
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    if origin is tuple:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return {"type": "array", "items": json_type(args[0]) if args else {}}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
    if annotation in simple:
        return {"type": simple[annotation]}
    return {}  # paths and other objects: recorded as strings or objects, not constrained here


def record_schema(cls: Any) -> dict[str, Any]:
    """The JSON Schema of a frozen report record (issue 35): its fields, their types, all
    required; what its ``to_dict()`` writes."""
    hints = typing.get_type_hints(cls)  # each field in the module of the class that declares it
    fields = [f.name for f in dataclasses.fields(cls)]
    return {"type": "object", "required": fields, "properties": {n: json_type(hints[n]) for n in fields}}


def options_schema(command: str) -> dict[str, Any]:
    """The ``options`` object of ``command``'s report, from its request (see module docstring)."""
    from inspect_model.registry import get

    spec = get(command)
    props: dict[str, Any] = {} if command in OWN_OPTIONS or not spec.images else dict(SHARED)
    required = [] if command in OWN_OPTIONS or not spec.images else list(SHARED_REQUIRED)
    cls = spec.request_class()
    if cls is not None:
        module = sys.modules[cls.__module__]
        hints = typing.get_type_hints(cls, globalns=vars(module))
        for f in dataclasses.fields(cls):
            props[f.name] = json_type(hints[f.name])
    if command == "summary":  # the model options summary records itself
        props.update({k: SHARED[k] for k in ("model", "weights", "checkpoint", "device", "dtype", "seed")})
    props.update(EXTRA.get(command, {}))
    props.update(OVERRIDE.get(command, {}))
    out: dict[str, Any] = {"type": "object", "properties": dict(sorted(props.items()))}
    if required:
        out["required"] = required
    return out


def regenerate(command: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a published schema) with its generated parts made anew."""
    from inspect_model.registry import get

    out = json.loads(json.dumps(doc))
    out["properties"]["command"] = {"const": command}
    out["properties"]["options"] = options_schema(command)
    if '"#/$defs/input_box"' in json.dumps(doc):  # the reports that hold detections' boxes
        out.setdefault("$defs", {}).update(json.loads(json.dumps(BOX_DEFS)))
    spec = get(command)
    if spec.report is not None:  # the report's body is its record type's (the record writes it)
        body = record_schema(spec.report)
        out["properties"].update(body["properties"])
        out["required"] = [r for r in out.get("required", []) if r not in body["properties"]] + body["required"]
    if spec.methods is not None:  # the method family's registry
        out.setdefault("$defs", {})["method"] = {"enum": list(spec.methods())}
    return out


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """The published schema files that differ from their regeneration."""
    from inspect_model.registry import COMMANDS

    out = []
    for name, spec in COMMANDS.items():
        if spec.schema is None:
            continue
        path = HERE / spec.schema
        text = path.read_text(encoding="utf-8")
        if dumps(regenerate(name, json.loads(text))) != text:
            out.append(spec.schema)
    return out


def write() -> list[str]:
    from inspect_model.registry import COMMANDS

    written = []
    for name, spec in COMMANDS.items():
        if spec.schema is None:
            continue
        path = HERE / spec.schema
        new = dumps(regenerate(name, json.loads(path.read_text(encoding="utf-8"))))
        if new != path.read_text(encoding="utf-8"):
            path.write_text(new, encoding="utf-8")
            written.append(spec.schema)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--write" in args:
        for name in write():
            print(f"wrote {name}")
        return 0
    bad = stale()
    for name in bad:
        print(f"{name} is out of date: python -m inspect_model.schemas.generate --write", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
