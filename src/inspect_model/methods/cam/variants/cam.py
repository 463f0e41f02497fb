"""CAM (Zhou et al. 2016): the classifier's weights of the target class over the last
feature map; only where the network ends in global pooling + one linear layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import CamMethod, MapInputs, register
from inspect_model.methods.cam.maths import cam_map

if TYPE_CHECKING:
    import torch


@register
class Cam(CamMethod):
    name, title, paper, order = "cam", "CAM", "Zhou et al. 2016", 0
    in_all = "if-fits"
    needs_classifier = True

    def maps(self, inp: MapInputs) -> torch.Tensor:
        import torch

        w = inp.fc_weight()
        return torch.stack([cam_map(inp.A, w, inp.classes[:, j]) for j in range(inp.k)])
