"""XGrad-CAM (Fu et al. 2020)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import GradientCam, register
from inspect_model.methods.cam.maths import EPS

if TYPE_CHECKING:
    import torch


@register
class XGradCam(GradientCam):
    name, title, paper, order = "xgradcam", "XGrad-CAM", "Fu et al. 2020", 30

    def weigh(self, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        # Eq. 9: alpha_k = sum_ij (A_k_ij / sum_ij A_k_ij) dS/dA_k_ij.
        sp = tuple(range(2, A.dim()))
        w = (G * A).sum(dim=sp, keepdim=True) / (A.sum(dim=sp, keepdim=True) + EPS)
        return (w * A).sum(dim=1)
