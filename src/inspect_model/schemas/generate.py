"""The published JSON Schemas, generated from the code that writes the reports (issue 35).

Each command's report schema (``schemas/<command>.json``) ships with the package and is made
here from its one source (:func:`document`):

- the report body: the command's report record (``report=`` on its registry entry), a frozen
  dataclass over :class:`inspect_model.reports.base.Record` whose fields, annotations and
  ``fact(...)`` keywords give every key, its type and bounds (:mod:`.types`);
- ``properties.options``: the report's ``options`` object, from the command's request fields
  plus the model and input options every image command shares;
- the envelope (:data:`ENVELOPE`: versions, files, ``nonfinite``) and ``command.const``;
- ``$defs.method.enum`` (cam, attention, attributions): the command's method family's
  registry (``CommandSpec.methods``).

A new command's schema: write its record types, name them on the entry
(``@command("lens", ..., schema="lens.json", report=LensReport)``), run
``python -m inspect_model.schemas.generate --write``. ``--check`` (the default) fails, naming
the file, when a published file differs from its generation (the tests run it).
:func:`inspect_model.schemas.load_schema` generates from the live registries, so a method or
command registered at run time is in it. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

from inspect_model.schemas.types import json_type, record_schema

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

__all__ = ["document", "json_type", "main", "options_schema", "record_schema", "stale", "write"]

SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"
#: What output/jsonout.envelope writes around every report body (``options`` is the command's).
ENVELOPE: dict[str, Any] = {
    "tool_version": {"type": "string"},
    "python_version": {"type": "string"},
    "torch_version": {"type": "string"},
    "torchvision_version": {"type": "string"},
    "files": {"type": "array", "items": {"type": "string"}},
    "nonfinite": {"type": "array", "items": {"type": "string"},
                  "description": "JSON paths of values that were NaN or infinite (written as null)"},
}
ENVELOPE_REQUIRED = ["schema_version", "command", "tool_version", "python_version", "options", "files"]


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


def document(command: str) -> dict[str, Any]:
    """The whole published schema of ``command``'s report, from its entry's record type
    (``report=``), its request (``options``) and its method family (``$defs.method``)."""
    from inspect_model.output.jsonout import SCHEMA_VERSION
    from inspect_model.registry import get

    spec = get(command)
    defs: dict[str, Any] = {}
    body = record_schema(spec.report, defs)
    extra = dict(getattr(spec.report, "SCHEMA", None) or {})
    props: dict[str, Any] = {"schema_version": {"const": SCHEMA_VERSION}, "command": {"const": command}}
    props.update({"options": options_schema(command), **ENVELOPE, **body["properties"]})
    doc: dict[str, Any] = {"$schema": SCHEMA_URL, "$id": f"https://inspect-model.dev/schemas/{command}.json",
                           "title": getattr(spec.report, "TITLE", None) or f"inspect-model {command} report"}
    if "description" in extra:
        doc["description"] = extra.pop("description")
    doc.update({"type": "object", "required": ENVELOPE_REQUIRED + body.get("required", []), "properties": props})
    doc.update(extra)
    if spec.methods is not None:  # the method family's registry
        defs["method"] = {"enum": list(spec.methods())}
    if defs:
        doc["$defs"] = defs
    return doc


def regenerate(command: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a hand-kept schema of a command with no report record yet) with its
    generated parts made anew: ``command``, ``options`` and the method enum."""
    from inspect_model.registry import get

    spec = get(command)
    if spec.report is not None:
        return document(command)
    out = json.loads(json.dumps(doc))
    out["properties"]["command"] = {"const": command}
    out["properties"]["options"] = options_schema(command)
    if spec.methods is not None:
        out.setdefault("$defs", {})["method"] = {"enum": list(spec.methods())}
    return out


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def expected(command: str) -> str | None:
    """The text ``schemas/<command>.json`` should hold; None for a command without a schema."""
    from inspect_model.registry import get

    spec = get(command)
    if spec.schema is None:
        return None
    if spec.report is not None:
        return dumps(document(command))
    if not (HERE / spec.schema).is_file():
        return None
    return dumps(regenerate(command, json.loads((HERE / spec.schema).read_text(encoding="utf-8"))))


def stale() -> list[str]:
    """The published schema files that differ from their generation (or are missing)."""
    from inspect_model.registry import COMMANDS

    out = []
    for name, spec in COMMANDS.items():
        text = expected(name)
        path = HERE / str(spec.schema)
        if text is not None and (not path.is_file() or path.read_text(encoding="utf-8") != text):
            out.append(str(spec.schema))
    return out


def write() -> list[str]:
    """Write every stale schema file; the names written."""
    from inspect_model.registry import COMMANDS

    written = []
    for name in stale():
        command = next(c for c, s in COMMANDS.items() if s.schema == name)
        (HERE / name).write_text(str(expected(command)), encoding="utf-8")
        written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    """``--write`` rewrites the stale files; otherwise (``--check``) exits 1 naming each."""
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
