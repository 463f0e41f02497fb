"""JSON Schemas (draft 2020-12) of each command's ``--json`` report, shipped with the package."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of ``command``'s report (e.g. ``"summary"``, ``"guided-backprop"``),
    generated from its report record and the registries as they are now (so a method or
    option added at run time is in it); the published file equals it (``generate --check``)."""
    from inspect_model.registry import COMMANDS
    from inspect_model.schemas.generate import document, regenerate

    spec = COMMANDS.get(command)
    if spec is not None and spec.report is not None:
        return document(command)
    text = resources.files(__name__).joinpath(f"{command}.json").read_text(encoding="utf-8")
    return regenerate(command, json.loads(text))


def available() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))
