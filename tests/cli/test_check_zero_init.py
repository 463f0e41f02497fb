"""`check` passes healthy untrained models and still fails dead ReLUs (issue 29.7).

timm's ResNets set the last BatchNorm of each block to zero (``zero_init_last``) and
torchvision's ViT zero-initialises its head: their outputs are exactly zero by design, and
``check MODEL --weights none`` (CI's smoke check of an architecture) must pass them, naming
them as zero-initialised. A ReLU whose input is always negative is dead and still fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from inspect_model.engine.selection import select_layers
from inspect_model.methods.checks.smoke import run_checks

DEAD_RELU = '''
import torch
from torch import nn


class DeadReLU(nn.Module):
    """fc's bias of -100 keeps every pre-activation negative: relu is dead (in place, as
    torchvision's ResNets use it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 8)
        with torch.no_grad():
            self.fc.bias.fill_(-100.0)
        self.relu = nn.ReLU(inplace=True)
        self.relu2 = nn.ReLU()  # fed only zeros: not where the dead path starts
        self.head = nn.Linear(8, 3)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.relu2(self.relu(self.fc(x))))
'''


def _dead(model: nn.Module, x: torch.Tensor) -> object:
    res = run_checks(model, (x,), layers=select_layers(model))
    return next(r for r in res if r.name == "dead layers")


@pytest.mark.slow  # over 3 s (issue 35: the quick tier under 2 minutes); full run only
def test_timm_resnet50_untrained_passes() -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet50", pretrained=False).eval()
    assert float(model.layer1[0].bn3.weight.abs().sum()) == 0  # zero_init_last, as timm builds it
    r = _dead(model, torch.randn(1, 3, 32, 32))
    assert r.passed and r.value == 0, r.detail
    assert r.detail.startswith("16 zero-initialised layer(s) not counted") and "layer1.0.bn3" in r.detail


def test_torchvision_vit_untrained_passes() -> None:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2, hidden_dim=16,
                              mlp_dim=32, num_classes=10).eval()
    r = _dead(model, torch.randn(1, 3, 32, 32))
    assert r.passed and r.value == 0, r.detail
    assert "1 zero-initialised layer(s) not counted" in r.detail and "heads.head" in r.detail


def test_dead_relu_still_fails_beside_a_zero_head(cli, tmp_path: Path) -> None:
    p = tmp_path / "dead.py"
    p.write_text(DEAD_RELU)
    res = cli(["check", f"{p}:DeadReLU", "--input-size", "4", "--json"])
    assert res.exit_code == 1, res.stderr
    check = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "dead layers")
    assert check["status"] == "fail" and check["value"] == 1
    assert check["detail"] == "relu; 1 zero-initialised layer(s) not counted, their weights are exactly 0: head"
    assert res.stderr.strip().splitlines() == [
        "error: check failed: dead layers 1 (expected none with zero fraction >= 1)"]


def test_zero_weights_with_a_bias_are_no_zero_output() -> None:
    """A zero weight with a non-zero bias gives a constant, not zero: nothing to report."""
    lin = nn.Linear(4, 3)
    nn.init.zeros_(lin.weight)
    r = _dead(nn.Sequential(lin), torch.randn(2, 4))
    assert r.passed and r.detail == ""
