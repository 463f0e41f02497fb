"""A model that scales its input in place (``x /= 255``) runs in every command as plain
PyTorch runs it (issue 28.6): no "leaf Variable ... in-place operation" refusal, the same
numbers as the same model written out of place, and the caller's input left untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import inspect_model as im

MODELS = '''
import torch
from torch import nn


class Scales(nn.Module):
    inplace = True

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if self.inplace:
            x /= 255
        else:
            x = x / 255
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


class OutOfPlace(Scales):
    inplace = False
'''


@pytest.fixture
def models(tmp_path: Path) -> Path:
    p = tmp_path / "scales.py"
    p.write_text(MODELS)
    return p


def _module(models: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("scales", models)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _strip(doc: Any) -> Any:
    """The document without what names the model or the time."""
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in ("model", "options", "throughput", "seconds")}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


@pytest.mark.parametrize("command", ["cam", "grads", "guided-backprop", "activations", "check"])
def test_every_command_runs_an_in_place_input_model(cli, models: Path, command: str) -> None:
    extra = ["--deterministic"] if command == "check" else []
    runs = {}
    for name in ("Scales", "OutOfPlace"):
        res = cli([command, f"{models}:{name}", "--input-size", "3x8x8", "--weights", "none", "--json", *extra])
        assert res.exit_code == 0, (name, res.stderr)
        assert "in-place" not in res.stderr
        runs[name] = _strip(json.loads(res.stdout))
    assert runs["Scales"] == runs["OutOfPlace"]  # the same numbers as the out-of-place model


@pytest.mark.parametrize("api", ["cam", "grads", "guided_backprop", "activations"])
def test_the_callers_input_is_left_untouched(models: Path, api: str) -> None:
    mod = _module(models)
    x = torch.rand(2, 3, 8, 8) * 255
    before = x.clone()
    kwargs: dict[str, Any] = {"methods": ["gradcam", "scorecam"], "layers": ["conv"]} if api == "cam" else {}
    getattr(im, api)(mod.Scales(), x, **kwargs)
    assert torch.equal(x, before)


def test_grads_input_gradient_is_wrt_the_model_input(models: Path) -> None:
    """d(score)/d(x) of the in-place model = the out-of-place one's, by autograd on plain torch."""
    mod = _module(models)
    x = torch.rand(1, 3, 8, 8) * 255
    rep = im.grads(mod.Scales(), x, target="1").record
    ref_x = x.clone().requires_grad_(True)
    mod.OutOfPlace()(ref_x)[0, 1].backward()
    assert rep.input_grad.norm == pytest.approx(float(ref_x.grad.double().norm()), rel=1e-5)


def test_plain_nn_module_in_place_input_runs_in_check() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x -= 1.0
            return self.fc(x)

    r = im.check(Net(), torch.randn(1, 4), deterministic=True)
    assert r.passed, r.failures
