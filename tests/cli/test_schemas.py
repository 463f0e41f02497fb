"""Real JSON reports validate against the schemas shipped in the package."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from inspect_model.schemas import available, load_schema


def _validate(command: str, stdout: str) -> dict:
    doc = json.loads(stdout)
    jsonschema.Draft202012Validator(load_schema(command)).validate(doc)
    return doc


def test_every_command_ships_a_schema() -> None:
    from inspect_model.cli.app import COMMANDS

    assert set(COMMANDS) <= set(available())
    for name in available():
        jsonschema.Draft202012Validator.check_schema(load_schema(name))


def test_summary_report_validates(cli, models_py: Path) -> None:
    r = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--json"])
    assert r.exit_code == 0, r.stderr
    _validate("summary", r.stdout)


def test_models_report_validates(cli) -> None:
    r = cli(["models", "vit*", "--json"])
    _validate("models", r.stdout)


def test_check_report_validates(cli, models_py: Path) -> None:
    r = cli(["check", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--expect-params", "1493", "--json"])
    assert r.exit_code == 0, r.stderr
    _validate("check", r.stdout)


def test_schema_rejects_a_broken_report(cli, models_py: Path) -> None:
    r = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--json"])
    doc = json.loads(r.stdout)
    del doc["layers"][0]["macs"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(load_schema("summary")).validate(doc)


def test_nan_is_written_as_null_with_a_flag() -> None:
    from inspect_model.output.jsonout import dumps

    text = dumps({"a": float("nan"), "b": [1.0, float("inf")]})
    doc = json.loads(text)
    assert doc["a"] is None and doc["b"] == [1.0, None]
    assert doc["nonfinite"] == ["$.a", "$.b[1]"]


IMAGE_COMMANDS = {
    "activations": [],
    "grads": [],
    "guided-backprop": [],
    "cam": ["--method", "gradcam"],
    "attributions": ["--method", "saliency,integrated-gradients", "--steps", "4"],
}


@pytest.mark.parametrize("command", sorted(IMAGE_COMMANDS))
def test_reports_without_an_output_directory_validate(cli, models_py: Path, command: str) -> None:
    """--json with no -o: lists of files that were not written are empty, not missing."""
    image = str(Path(__file__).resolve().parents[2] / "sample_images" / "cat.jpg")
    r = cli([command, f"{models_py}:TinyCNN", image, "--resize", "32", "--crop", "32", "--json",
             *IMAGE_COMMANDS[command]])
    assert r.exit_code == 0, r.stderr
    _validate(command, r.stdout)
