"""JSON reports: one envelope for every command, strict JSON (NaN/Inf written as null).

``envelope`` adds what every document carries (schema_version, command, versions, options,
files written); ``dumps`` sorts keys and replaces non-finite floats by ``null``, listing
their paths under ``nonfinite`` so that a reader can tell a NaN from a missing value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

SCHEMA_VERSION = 2


def versions() -> dict[str, str]:
    from inspect_model._version import __version__

    out = {"tool_version": __version__, "python_version": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_version"] = str(torch.__version__)
    tv = sys.modules.get("torchvision")
    if tv is not None:
        out["torchvision_version"] = str(tv.__version__)
    return out


def envelope(command: str, payload: dict[str, Any], *, options: dict[str, Any] | None = None,
             files: list[str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command}
    doc.update(versions())
    doc["options"] = options or {}
    doc["files"] = list(files or [])
    doc.update(payload)
    return doc


def to_jsonable(obj: Any, path: str = "$", nonfinite: list[str] | None = None) -> Any:
    """Plain JSON values from dataclasses, tuples, tensors' scalars; NaN/Inf become None and
    their paths are appended to ``nonfinite``."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if nonfinite is not None:
            nonfinite.append(path)
        return None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, f"{path}.{k}", nonfinite) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, f"{path}[{i}]", nonfinite) for i, v in enumerate(obj)]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        try:
            return to_jsonable(obj.item(), path, nonfinite)
        except (ValueError, RuntimeError):
            pass
    if hasattr(obj, "tolist"):
        return to_jsonable(obj.tolist(), path, nonfinite)
    return str(obj)


def dumps(doc: dict[str, Any], *, indent: int | None = 2) -> str:
    nonfinite: list[str] = []
    clean = to_jsonable(doc, "$", nonfinite)
    if nonfinite:
        clean["nonfinite"] = nonfinite
    return json.dumps(clean, sort_keys=True, allow_nan=False, indent=indent)
