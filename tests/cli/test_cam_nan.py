"""Eigen-CAM on NaN activations (issue 14): the map becomes a warning, the other maps of the
same call are kept (it used to raise LinAlgError out of compute_cams)."""

from __future__ import annotations

import torch
from torch import nn

from inspect_model.methods.cam.maps import compute_cams


class NaNSpot(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[0, 0, 1, 1] = float("nan")  # the first image only
        return x


class HasNaN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.spot = NaNSpot()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nan_to_num(self.spot(self.conv(x)))  # the output stays finite
        return self.fc(torch.flatten(self.pool(h), 1))


def test_eigencam_on_nan_activations_is_a_warning_and_other_maps_are_kept() -> None:
    model = HasNaN().eval()
    x = torch.randn(2, 3, 8, 8)
    res = compute_cams(model, x, layers=["conv", "spot"], methods=["gradcam", "eigencam"], target=[1, 1])
    got = {(m.layer, m.method, m.sample): m for m in res.maps}
    assert set(got) == {(la, me, s) for la in ("conv", "spot") for me in ("gradcam", "eigencam") for s in (0, 1)}
    bad = got[("spot", "eigencam", 0)]
    assert any("NaN/Inf" in w for w in bad.warnings), bad.warnings
    assert torch.isfinite(bad.map).all()  # shown with the NaNs as 0
    assert not got[("spot", "eigencam", 1)].warnings  # the clean image keeps its map
    for s in (0, 1):
        for method in ("gradcam", "eigencam"):
            good = got[("conv", method, s)]
            assert not any("NaN" in w for w in good.warnings), good.warnings
            assert float(good.map.max()) == 1.0
