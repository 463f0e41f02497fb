"""HiResCAM (Draelos & Carin 2020)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import GradientCam, register

if TYPE_CHECKING:
    import torch


@register
class HiResCam(GradientCam):
    name, title, paper, order = "hirescam", "HiResCAM", "Draelos & Carin 2020", 50

    def weigh(self, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        # The element-wise product, no spatial averaging of gradients.
        return (G * A).sum(dim=1)
