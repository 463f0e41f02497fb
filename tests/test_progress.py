"""Progress of the long inner loops (issue 15): Score-CAM's masked passes, the sanity
check's randomised models and grads' per-layer work report (done, total, label)."""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

import inspect_model as im


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 5, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 4)).eval()


class Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str | None]] = []

    def __call__(self, done: int, total: int, label: str | None = None) -> None:
        assert label is None or 0 < done <= total
        self.calls.append((done, total, label))

    def of(self, label: str) -> list[tuple[int, int]]:
        return [(d, t) for d, t, lab in self.calls if lab == label]


def test_scorecam_reports_every_masked_pass() -> None:
    calls = Calls()
    x = torch.randn(2, 3, 8, 8)
    r = im.cam(_net(), x, methods=["scorecam"], layers=["2"], scorecam_batch=2, progress=calls)
    passes = calls.of("scorecam: masked forward passes")
    assert passes == [(i, 5) for i in range(1, 6)]  # ceil(2 images x 5 channels / 2): across images
    assert r.to_dict()["passes"]["scorecam_forward"] == 5


def test_sanity_check_reports_each_randomised_model() -> None:
    calls = Calls()
    im.guided_backprop(_net(), torch.randn(1, 3, 8, 8), sanity=True, progress=calls)
    steps = calls.of("sanity: randomised models")
    assert steps and steps[-1][0] == steps[-1][1] and [d for d, _ in steps] == list(range(1, len(steps) + 1))


def test_grads_reports_layers_and_parameters() -> None:
    calls = Calls()
    im.grads(_net(), torch.randn(2, 3, 8, 8), progress=calls)
    layers = calls.of("grads: layer gradients")
    params = calls.of("grads: parameter gradients")
    assert layers and layers[-1][0] == layers[-1][1]
    assert params == [(i, 6) for i in range(1, 7)]  # 3 weights and 3 biases


def test_cli_bar_has_one_task_per_label(monkeypatch: Any) -> None:
    from inspect_model.cli import progress as mod
    from inspect_model.cli.common import Messages

    monkeypatch.setattr(mod, "_stderr_is_terminal", lambda: True)
    with mod.Progress("cam", Messages(False)) as p:
        p(1, 4)
        p(1, 3, "scorecam: masked forward passes")
        p(3, 3, "scorecam: masked forward passes")
        p(1, 3, "scorecam: masked forward passes")  # the next batch starts again
        assert [t.description for t in p._bar.tasks] == ["cam", "scorecam: masked forward passes"]
        assert p._bar.tasks[1].completed == 1
        p._bar.console.file = io.StringIO()
