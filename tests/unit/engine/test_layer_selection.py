"""Layer selection (issue 14): a glob selects what it matched, ``name[-1]`` is the module's
last child as PyTorch indexing, and ``--layer auto`` picks a layer on the scored output's path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspect_model.engine.selection import select_layers
from inspect_model.errors import LayerSelectionError
from inspect_model.methods.cam.layers import auto_layer


def _block() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer4 = nn.Sequential(_block(), _block(), _block())
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layer4(self.stem(x)).mean((2, 3)))


def test_a_glob_matching_containers_selects_them() -> None:
    assert select_layers(Net(), ["layer4.?"]) == ["layer4.0", "layer4.1", "layer4.2"]
    assert select_layers(Net(), ["layer4.*"])[:3] == ["layer4.0.0", "layer4.0.1", "layer4.0.2"]
    assert select_layers(Net(), ["layer?"]) == ["layer4"]


def test_index_after_a_name_is_a_child_position() -> None:
    net = Net()
    assert select_layers(net, ["layer4[-1]"]) == ["layer4.2"]
    assert net.get_submodule(select_layers(net, ["layer4[-1]"])[0]) is net.layer4[-1]
    assert select_layers(net, ["layer4[0:2]"]) == ["layer4.0", "layer4.1"]
    assert select_layers(net, ["layer4.2[0]"]) == ["layer4.2.0"]
    assert select_layers(net, ["layer4.*[-1]"]) == ["layer4.2.2"]  # a glob: among what it selected
    with pytest.raises(LayerSelectionError, match="'fc' has no children"):
        select_layers(net, ["fc[0]"])


class TwoHeads(nn.Module):
    """`seg` runs last but only feeds the 'seg' output; 'logits' comes from `trunk`."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(4, 3)
        self.seg = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(x)
        return {"logits": self.head(h.mean((2, 3))), "seg": self.seg(h)}


def test_auto_picks_a_layer_the_scored_output_depends_on() -> None:
    model = TwoHeads().eval()
    x = torch.randn(1, 3, 8, 8)
    assert auto_layer(model, x) == "trunk"
    assert auto_layer(model, x, "logits") == "trunk"
    assert auto_layer(model, x, "seg") == "seg"
    assert all(p.grad is None for p in model.parameters())
