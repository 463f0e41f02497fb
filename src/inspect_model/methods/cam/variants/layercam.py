"""Layer-CAM (Jiang et al. 2021)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import GradientCam, register

if TYPE_CHECKING:
    import torch


@register
class LayerCam(GradientCam):
    name, title, paper, order = "layercam", "Layer-CAM", "Jiang et al. 2021", 40

    def weigh(self, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        # A per-location weight relu(dS/dA_k_ij) times the activation.
        import torch

        return (torch.relu(G) * A).sum(dim=1)
