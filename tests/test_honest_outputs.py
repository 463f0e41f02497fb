"""Outputs that used to be wrong or silently cut (issue 14): a dead layer counted once under
--deterministic, every layer in the gradient histograms (paginated), and the finite-outputs
check saying what its number counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import register_model


class DeadRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU()
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.bias.fill_(-1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.fc(x)) + x


def test_deterministic_counts_a_dead_layer_once(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, DeadRelu())
    res = cli(["check", spec, "--input-size", "4", "--weights", "none", "--deterministic"])
    assert res.exit_code == 1
    line = next(ln for ln in res.stdout.splitlines() if "dead layers" in ln)
    assert "dead layers: 1 " in line and line.endswith("(relu)"), line


def test_finite_outputs_says_non_finite_values(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    class Log(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x - 10.0)

    spec = register_model(monkeypatch, Log())
    res = cli(["check", spec, "--input-size", "5", "--weights", "none", "--max-dead-fraction", "1.0"])
    assert res.exit_code == 1
    assert "FAIL  finite outputs: 5 non-finite values (expected 0)" in res.stdout, res.stdout
    assert "finite outputs 5 non-finite values (expected 0)" in res.stderr, res.stderr


def test_grads_histograms_show_every_layer_on_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      cli) -> None:
    from inspect_model.render.gradients import HIST_PER_PAGE

    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(60)])  # 60 layers: every one on a page
    spec = register_model(monkeypatch, model)
    res = cli(["grads", spec, "--input-size", "4", "--weights", "none", "-o", str(tmp_path / "g"), "--quiet"])
    assert res.exit_code == 0, res.stderr
    pages = sorted(p.name for p in (tmp_path / "g").glob("grad_histograms_*.png"))
    n_pages = -(-60 // HIST_PER_PAGE)
    assert pages == [f"grad_histograms_{i:03d}.png" for i in range(1, n_pages + 1)]

    import inspect_model as im
    from inspect_model.render.gradients import histogram_pages

    result = im.grads(model, inputs=im.InputOptions(input_size=["4"]), model_options=im.ModelOptions(model, weights=None))
    assert len(histogram_pages(result.record)) == n_pages  # tests/test_pictures.py checks each layer's panel
