"""The Python API: model objects in, plain records out, nothing printed, model untouched."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import inspect_model as im
from fixtures.models import TinyCNN, assert_unchanged, model_state


def test_import_is_lazy() -> None:
    import subprocess

    code = "import inspect_model, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "False"


def test_every_exported_name_resolves() -> None:
    for name in im.__all__:
        assert getattr(im, name) is not None


def test_api_round_trip_on_a_model_object(capsys: pytest.CaptureFixture[str]) -> None:
    model = TinyCNN().eval()
    x = torch.randn(3, 3, 8, 8)
    before = model_state(model)

    table = im.summary(model, input_size=["3x8x8"])
    assert table.total_params == sum(p.numel() for p in model.parameters())

    acts = im.capture_activations(model, x, layers=["type:Conv2d"])
    assert [r.name for r in acts.layers] == ["features.0", "features.3"]

    grads = im.compute_gradients(model, x, target="predicted", fail_on="nan,inf")
    assert not grads.failures()
    total = sum(float(p.norm) ** 2 for p in grads.params if p.has_grad) ** 0.5
    assert grads.global_norm == pytest.approx(total, rel=1e-5)

    cams = im.compute_cams(model, x, methods=["gradcam", "layercam"])
    assert {m.method for m in cams.maps} == {"gradcam", "layercam"}

    gb = im.guided_backprop(model, x, "top:2")
    assert gb.gradients.shape == (3, 2, 3, 8, 8)

    with im.HookEngine(model, im.select_layers(model, ["fc"]), im.CaptureOptions(keep=True)) as eng:
        y = model(x)
    assert torch.equal(eng.records[0].outputs[0].tensor, y.detach())

    assert capsys.readouterr() == ("", "")  # the API never prints
    assert_unchanged(model, before)


def test_cli_reports_the_api_numbers(cli, models_py) -> None:
    model_spec = f"{models_py}:TinyCNN"
    r = cli(["summary", model_spec, "--input-size", "3x8x8", "--json"])
    doc = json.loads(r.stdout)
    api = im.summary(im.load_model(model_spec), input_size=["3x8x8"])
    assert doc["total_macs"] == api.total_macs and doc["total_params"] == api.total_params
