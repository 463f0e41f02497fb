"""The ``attributions`` session through the API: report records against the maths,
files (heat maps, overlays, contact sheet, raw maps), --evaluate, --sanity, errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from inspect_model.api.attributions import AttributionsRequest, attributions
from inspect_model.errors import UsageError
from inspect_model.methods.attributions.maps import AttributionSettings, attribute, map_statistics


def valid(res) -> dict:
    """The --json document, as written (NaN as null), checked against the shipped schema."""
    import jsonschema

    from inspect_model.output.jsonout import dumps
    from inspect_model.schemas import load_schema

    doc = json.loads(dumps(res.to_dict()))
    jsonschema.Draft202012Validator(load_schema("attributions")).validate(doc)
    return doc


def tiny() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(16, 5)).eval()


def images() -> torch.Tensor:
    return torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(6))


def test_api_maps_and_records_match_the_methods() -> None:
    model, x = tiny(), images()
    res = attributions(model, x, "top:2", methods=["saliency", "integrated-gradients", "occlusion"], steps=8,
                       window="4", baseline="blur")
    ref = attribute(model, x, "top:2", AttributionSettings(methods=("saliency", "integrated-gradients", "occlusion"),
                                                           steps=8, window=(4,), baseline="blur", batch_size=8))
    doc = valid(res)
    assert doc["command"] == "attributions" and doc["methods"] == ["saliency", "integrated-gradients", "occlusion"]
    for m in ref.maps:
        torch.testing.assert_close(res.maps[m], ref.maps[m])
    for i, entry in enumerate(doc["images"]):
        assert entry["targets"] == ref.targets[i]
        for rec in entry["maps"]:
            stats = map_statistics(ref.maps[rec["method"]][i, rec["rank"]])
            assert rec["positive_mass"] == pytest.approx(stats["positive"])
            assert rec["negative_mass"] == pytest.approx(stats["negative"])
            if rec["method"] == "integrated-gradients":
                assert rec["completeness_gap"] == pytest.approx(ref.deltas[i][rec["rank"]])
                assert rec["sum"] - (rec["target"]["score"] - rec["baseline_score"]) == pytest.approx(
                    rec["completeness_gap"], abs=1e-5)
            else:
                assert "completeness_gap" not in rec
            assert rec["signed"] == (rec["method"] != "saliency")
    assert doc["options"]["steps"] == 8 and doc["options"]["baseline"] == "blur"
    assert doc["options"]["window"] == "4" and doc["options"]["stride"] is None


def test_files_report_and_contact_sheet(tmp_path) -> None:
    model, x = tiny(), images()
    out = tmp_path / "run"
    res = attributions(model, x, 1, methods=["gradient", "guided"], save_raw=True, output_dir=out, keep=True)
    files = set(res.files)
    for i in range(3):
        for m in ("gradient", "guided"):
            assert f"images/{i:04d}-input{i}/{m}.c1.heatmap.png" in files or any(
                f.startswith(f"images/{i:04d}") and f.endswith(f"{m}.c1.heatmap.png") for f in files)
    assert "contact_sheet_001.png" in files and "report.html" in files
    raw = [f for f in files if f.endswith(".npy")]
    assert len(raw) == 6
    doc = json.loads((out / "report.json").read_text())
    first = doc["images"][0]["maps"][0]
    arr = __import__("numpy").load(out / first["files"]["raw"])
    torch.testing.assert_close(torch.from_numpy(arr), res.maps["gradient"][0, 0])


def test_evaluate_and_sanity_cover_every_method() -> None:
    model, x = tiny(), images()[:2]
    res = attributions(model, x, methods=["saliency", "input-x-gradient", "smoothgrad"], samples=2, evaluate=True,
                       eval_steps=4, metrics=["deletion", "insertion"], sanity=True)
    doc = valid(res)
    ev = doc["evaluation"]
    assert {row["method"] for row in ev["average"]} == {"saliency", "input-x-gradient", "smoothgrad"}
    for entry in doc["images"]:
        for rec in entry["maps"]:
            assert set(rec["evaluation"]["scores"]) >= {"deletion", "insertion"}
    san = doc["sanity"]
    assert san["steps"][-1]["randomized"] == len(san["layers"]) == 2
    for step in san["steps"]:
        assert set(step["methods"]) == {"saliency", "input-x-gradient", "smoothgrad"}
        assert len(step["methods"]["saliency"]["spearman"]) == 2


def test_request_errors_come_before_any_model_work() -> None:
    with pytest.raises(UsageError, match="--steps 0"):
        AttributionsRequest(methods=("integrated-gradients",), steps=0)
    with pytest.raises(UsageError, match="--window 'a,b'"):
        AttributionsRequest(methods=("occlusion",), window="a,b")
    with pytest.raises(UsageError, match="--metric needs --evaluate"):
        AttributionsRequest(metrics=("deletion",))
    with pytest.raises(TypeError, match="unexpected keyword argument 'step'"):
        attributions(tiny(), images(), step=3)
