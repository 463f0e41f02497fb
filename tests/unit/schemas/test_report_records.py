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


def test_every_published_schema_is_generated_from_a_report_record() -> None:
    """Each command with a schema names its report record; the files equal their generation."""
    from inspect_model.registry import COMMANDS
    from inspect_model.reports.base import Record
    from inspect_model.schemas.generate import document, stale

    with_schema = {n: s for n, s in COMMANDS.items() if s.schema is not None}
    assert {"summary", "activations", "grads", "guided-backprop", "cam", "attributions", "attention",
            "check", "models"} <= set(with_schema)
    for name, spec in with_schema.items():
        assert spec.report is not None and dataclasses.is_dataclass(spec.report), name
        doc = document(name)
        keys = spec.report.keys() if issubclass(spec.report, Record) else [f.name for f in dataclasses.fields(spec.report)]
        assert set(keys) <= set(doc["properties"]), name
    assert stale() == []


def test_check_fails_and_names_the_file_when_a_record_changes(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from inspect_model import registry
    from inspect_model.reports.base import fact, record
    from inspect_model.reports.check import CheckReport
    from inspect_model.schemas.generate import main

    assert main(["--check"]) == 0

    @record
    class Wider(CheckReport):
        duration: float = fact(doc="seconds", minimum=0)

    monkeypatch.setitem(registry.COMMANDS, "check", dataclasses.replace(registry.get("check"), report=Wider))
    assert main(["--check"]) == 1
    assert "check.json is out of date" in capsys.readouterr().err


def test_records_write_their_keys_and_leave_absent_optional_ones_out() -> None:
    from inspect_model.reports.base import ABSENT
    from inspect_model.reports.common import Detection
    from inspect_model.schemas.types import record_schema

    d = Detection(class_=3, label="cat", score=0.5, box=[0, 0, 4, 4], image_box=None, confidence=0.9,
                  matched_box=None, matched_image_box=None, iou=None)
    doc = d.to_dict()
    assert doc["class"] == 3 and "class_" not in doc and list(doc) == list(Detection.keys())
    schema = record_schema(Detection, {})
    assert "class" in schema["required"] and schema["properties"]["class"]["minimum"] == 0
    from inspect_model.reports.common import Segment

    seg = Segment(class_=1, label=None, score=None, area=3, area_fraction=0.1, mask_source="predicted")
    assert seg.region is ABSENT and "region" not in seg.to_dict()
    assert "region" not in record_schema(Segment, {})["required"]
    jsonschema.Draft202012Validator({**record_schema(Segment, defs := {}), "$defs": defs}).validate(seg.to_dict())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator({**record_schema(Segment, defs), "$defs": defs}).validate(
            {**seg.to_dict(), "mask_source": "guessed"})
