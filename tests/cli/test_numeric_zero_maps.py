"""Maps that are numerically zero relative to their inputs (issue 39, item 9): float rounding
noise is said in the report and in the picture, and drawn blank instead of at full contrast;
a classifier whose target score cancels exactly, and a detector whose gradients hardly reach
the layer (maps of ~1e-13, the same for every detection)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT

CAT = str(ROOT / "sample_images" / "cat.jpg")
CANCEL = '''
import torch
from torch import nn


class Dup(nn.Module):
    def forward(self, y):
        return torch.cat([y, y * 0.1], 1)


class Cancel(nn.Module):
    """Class 0's score is 0.1 * mean(y) - mean(0.1 * y): zero in exact arithmetic, so its
    Grad-CAM at 'feat' is float rounding noise. Class 1's is mean(y): a real map."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 3, padding=1)
        self.feat = Dup()

    def forward(self, x):
        a = self.feat(torch.relu(self.conv(x)) + 1.0)
        s = a[:, 0].mean((1, 2)) * 0.1 - a[:, 1].mean((1, 2))
        return torch.stack([s, a[:, 0].mean((1, 2))], 1)
'''


def _maps(doc: dict) -> list[dict]:
    return [m for img in doc["images"] for m in img["maps"]]


def test_classifier_noise_map_is_flagged_and_drawn_blank(cli, tmp_path: Path) -> None:
    (tmp_path / "cancel.py").write_text(CANCEL)
    out = tmp_path / "out"
    res = cli(["cam", f"{tmp_path / 'cancel.py'}:Cancel", CAT, "--layer", "feat", "--target", "0", "--resize", "32",
               "--crop", "32", "--save-raw", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.stderr
    (m,) = _maps(json.loads(res.stdout))
    assert 0 < abs(m["raw_max"]) < 1e-8  # not exactly constant: the old test let it through
    text = " ".join(w["message"] for w in json.loads(res.stdout)["warnings"])
    assert "the map is numerically zero" in text and "of the terms it sums" in text
    assert "numerically zero" in (out / "report.txt").read_text()
    shown = np.load(out / m["files"]["raw_input"])
    assert not shown.any()  # drawn blank, not stretched to full contrast
    from PIL import Image

    heat = Image.open(out / m["files"]["heatmap"]).convert("RGB")
    assert heat.size[0] > 200  # the picture says it in its title (looked at: tests/pictures in the report)


def test_a_real_map_of_the_same_model_is_not_flagged(cli, tmp_path: Path) -> None:
    (tmp_path / "cancel.py").write_text(CANCEL)
    res = cli(["cam", f"{tmp_path / 'cancel.py'}:Cancel", CAT, "--layer", "feat", "--target", "1", "--resize", "32",
               "--crop", "32", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert not [w for w in doc["warnings"] if "numerically zero" in w["message"]]


def test_relative_tests_by_hand() -> None:
    from inspect_model.methods.cam import maths as cm
    from inspect_model.render import overlay

    assert overlay.NUMERIC_ZERO == cm.NUMERIC_ZERO  # render's copy of the marker
    raw = torch.tensor([[1e-12, 3e-12], [2e-12, 0.0]])
    # against the terms it sums: 3e-12 of 1.0 is noise; of 1e-10 it is a map
    assert cm.is_numeric_zero(cm.map_warnings(raw, scale=1.0))
    assert not cm.map_warnings(raw, scale=1e-10)
    # against the score per location: 0.011 over 4 locations is 2.75e-3 each
    assert cm.is_numeric_zero(cm.map_warnings(raw, score=0.011))
    assert not cm.map_warnings(raw * 1e9, score=0.011)  # peak 3e-3 ~ the score's share
    assert not cm.map_warnings(raw)  # nothing to compare with: no claim
    A = torch.tensor([[[[1.0, -2.0]], [[3.0, 0.5]]]])  # (1, 2, 1, 2)
    G = torch.tensor([[[[0.5, 0.5]], [[-1.0, 2.0]]]])
    # location 0: 0.5 + 3; location 1: 1 + 1 -> 3.5
    assert torch.allclose(cm.term_scale(A, G), torch.tensor([3.5]))


@pytest.mark.slow
def test_detector_noise_maps_are_flagged(cli, tmp_path: Path) -> None:
    """fasterrcnn with random weights: its detections' Grad-CAM maps at the FPN are ~1e-13,
    the same for every detection; each says so, and the overlay's caption too."""
    out = tmp_path / "out"
    res = cli(["cam", "fasterrcnn_mobilenet_v3_large_320_fpn", CAT, "--weights", "none", "--score-threshold",
               "0.005", "-o", str(out), "--json", "--save-raw"])
    assert res.exit_code == 0, res.stderr
    maps = _maps(json.loads(res.stdout))
    assert maps and all(abs(m["raw_max"]) < 1e-9 for m in maps)
    flagged = [w for w in json.loads(res.stdout)["warnings"] if "numerically zero" in w["message"]]
    assert sum(w.get("count", 1) for w in flagged) == len(maps)
    assert "of the target's score per location" in flagged[0]["message"]
    assert all(not np.load(out / m["files"]["raw_input"]).any() for m in maps)
