"""Score-CAM (Wang et al. 2020): channels weighted by the target's probability on the input
masked by each channel; masked forward passes of its own (methods/cam/passes.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import CamMethod, MapInputs, register
from inspect_model.methods.cam.maths import scorecam_map

if TYPE_CHECKING:
    import torch


@register
class ScoreCam(CamMethod):
    name, title, paper, order = "scorecam", "Score-CAM", "Wang et al. 2020", 60
    one_pass = False

    def maps(self, inp: MapInputs) -> torch.Tensor:
        import torch

        weights = inp.masked_scores()  # (N, K, C)
        return torch.stack([scorecam_map(inp.A[i].float(), weights[i]) for i in range(inp.A.shape[0])], dim=1)
