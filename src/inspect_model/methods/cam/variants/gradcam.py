"""Grad-CAM (Selvaraju et al. 2017)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import GradientCam, register

if TYPE_CHECKING:
    import torch


@register
class GradCam(GradientCam):
    name, title, paper, order = "gradcam", "Grad-CAM", "Selvaraju et al. 2017", 10

    def weigh(self, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        # Eq. 1-2: alpha_k = mean_ij dS/dA_k_ij.
        w = G.mean(dim=tuple(range(2, A.dim())), keepdim=True)
        return (w * A).sum(dim=1)
