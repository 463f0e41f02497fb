"""JSON Schemas (draft 2020-12) of each command's ``--json`` report, shipped with the package."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of ``command``'s report (e.g. ``"summary"``, ``"guided-backprop"``)."""
    text = resources.files(__name__).joinpath(f"{command}.json").read_text(encoding="utf-8")
    return json.loads(text)


def available() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))
