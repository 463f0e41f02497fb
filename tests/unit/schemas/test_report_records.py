"""Typed report records (issue 35): a command whose registry entry names its frozen record
type (``report=``) gets its report body's JSON Schema generated from that type, so code and
schema cannot disagree: a field added to the record and not to the published schema fails here."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import pytest


def test_the_models_report_is_its_record_and_its_schema_is_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect_model as im
    from inspect_model import registry
    from inspect_model.api.models import ModelEntry, ModelsReport
    from inspect_model.schemas import load_schema
    from inspect_model.schemas.generate import record_schema, stale

    res = im.models("resnet1*")
    assert isinstance(res.record, ModelsReport) and res.record.count == len(res.record.models) > 0
    assert all(isinstance(m, ModelEntry) for m in res.record.models)
    doc = res.to_dict()
    assert doc["schema_version"] == load_schema("models")["properties"]["schema_version"]["const"]
    jsonschema.Draft202012Validator(load_schema("models")).validate(json.loads(json.dumps(doc)))
    body = record_schema(ModelsReport)
    published = load_schema("models")
    assert {k: published["properties"][k] for k in body["properties"]} == body["properties"]
    assert stale() == []

    @dataclasses.dataclass(frozen=True)
    class Wider(ModelsReport):  # a field the code now writes and the published schema lacks
        source: str = "torchvision"

    monkeypatch.setitem(registry.COMMANDS, "models", dataclasses.replace(registry.get("models"), report=Wider))
    assert stale() == ["models.json"]


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    value: float | None


@dataclasses.dataclass(frozen=True)
class Table:
    rows: tuple[Row, ...]
    note: Any


def test_record_schema_follows_nested_records() -> None:
    from inspect_model.schemas.generate import record_schema

    schema = record_schema(Table)
    assert schema["required"] == ["rows", "note"]
    assert schema["properties"]["rows"]["items"]["properties"]["value"] == {"type": ["number", "null"]}
