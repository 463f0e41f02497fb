"""``cam --evaluate --eval-steps auto`` (issue 40): each deletion/insertion curve starts at
8 steps and halves its steps (only the new points are run) while its AUC moves by more than
``--eval-tolerance``; a curve that stops at s steps is the fixed ``--eval-steps s`` curve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.models import TinyCNN
from inspect_model.methods.faithfulness import metrics as fa
from inspect_model.methods.faithfulness.passes import AUTO_STEPS, MapJob, evaluate_maps

SCHEMA = Path(__file__).resolve().parents[2] / "src" / "inspect_model" / "schemas" / "cam.json"


def _setup():  # noqa: ANN202
    torch.manual_seed(3)
    model = TinyCNN(in_ch=3, classes=5, width=4).eval()
    x = torch.randn(2, 3, 24, 20, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    jobs = [MapJob(i % 2, c, torch.rand(24, 20, generator=g), seed=i) for i, c in enumerate([0, 3, 1, 4])]
    return model, x, jobs


@pytest.mark.parametrize("tol", [1e-3, 0.05])
def test_auto_curves_are_the_fixed_curves_of_their_steps(tol: float) -> None:
    model, x, jobs = _setup()
    auto, _ = evaluate_maps(model, x, jobs, metrics=["deletion", "insertion", "confidence"], steps="auto",
                            batch=9, tolerance=tol)
    for j, s in enumerate(auto):
        assert set(s.steps) == {"deletion", "insertion"}
        for name, n in s.steps.items():
            assert n in AUTO_STEPS[1:]  # at least one refinement: two AUCs compared
            [fixed], _ = evaluate_maps(model, x, [jobs[j]], metrics=[name], steps=n, batch=9)
            assert s.curves[name] == pytest.approx(fixed.curves[name], abs=1e-6)
            assert s.scores[name] == pytest.approx(fixed.scores[name], abs=1e-6)
            [coarser], _ = evaluate_maps(model, x, [jobs[j]], metrics=[name], steps=n // 2, batch=9)
            moved = abs(fixed.scores[name] - coarser.scores[name])
            assert moved <= tol + 1e-6 or n == AUTO_STEPS[-1]
            if n > AUTO_STEPS[1]:  # refined further: the level before moved by more than tol
                [c4], _ = evaluate_maps(model, x, [jobs[j]], metrics=[name], steps=n // 4, batch=9)
                assert abs(coarser.scores[name] - c4.scores[name]) > tol - 1e-6
        conf = evaluate_maps(model, x, [jobs[j]], metrics=["confidence"], batch=9)[0][0]
        assert s.confidence == pytest.approx(conf.confidence, abs=1e-6)


def test_tighter_tolerance_takes_more_steps() -> None:
    model, x, jobs = _setup()
    loose, p_loose = evaluate_maps(model, x, jobs, metrics=["deletion"], steps="auto", tolerance=0.2)
    tight, p_tight = evaluate_maps(model, x, jobs, metrics=["deletion"], steps="auto", tolerance=1e-5)
    assert all(a.steps["deletion"] <= b.steps["deletion"] for a, b in zip(loose, tight))
    assert sum(b.steps["deletion"] for b in tight) > sum(a.steps["deletion"] for a in loose)
    assert p_tight > p_loose


def test_cli_reports_auto_steps_and_tolerance(cli, models_py: Path, tmp_path: Path) -> None:  # noqa: ANN001
    import jsonschema
    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for i in range(2):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(p)
        images.append(str(p))
    r = cli(["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--crop", "16", "-m", "gradcam,eigencam",
             "--evaluate", "--metric", "deletion", "--metric", "insertion", "--eval-steps", "auto",
             "--eval-tolerance", "0.01", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    schema = json.loads(SCHEMA.read_text())
    schema["properties"].pop("options")  # the evaluation and the maps are under test here, not the options
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    ev = doc["evaluation"]
    assert ev["steps"] == "auto" and ev["tolerance"] == 0.01
    for e in doc["images"]:
        for m in e["maps"]:
            steps = m["evaluation"]["steps"]
            assert set(steps) == {"deletion", "insertion"}
            for name, n in steps.items():
                assert len(m["evaluation"]["curves"][name]) == n + 1
                assert m["evaluation"]["scores"][name] == pytest.approx(fa.auc(m["evaluation"]["curves"][name]))
    for row in ev["average"]:  # curves of several lengths averaged on the finest grid
        assert len(row["curves"]["deletion"]) - 1 in AUTO_STEPS
    bad = cli(["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--evaluate", "--eval-steps", "many"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == ["error: --eval-steps 'many': give a number of steps (32) or auto"]


def test_attributions_evaluate_takes_auto_steps(cli, models_py: Path) -> None:  # noqa: ANN001
    import jsonschema

    from inspect_model.schemas import load_schema

    r = cli(["attributions", f"{models_py}:TinyCNN", "--input-size", "3x16x16", "--batch-size", "2", "-q",
             "-m", "saliency", "--evaluate", "--metric", "deletion", "--eval-steps", "auto", "--eval-tolerance",
             "0.02", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    schema = load_schema("attributions")
    schema["properties"].pop("options")  # the evaluation is under test here
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["evaluation"]["steps"] == "auto" and doc["evaluation"]["tolerance"] == 0.02
    assert doc["options"]["eval_steps"] == "auto" and doc["options"]["eval_tolerance"] == 0.02
    for e in doc["images"]:
        for m in e["maps"]:
            n = m["evaluation"]["steps"]["deletion"]
            assert n in AUTO_STEPS and len(m["evaluation"]["curves"]["deletion"]) == n + 1
