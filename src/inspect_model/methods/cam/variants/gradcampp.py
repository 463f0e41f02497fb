"""Grad-CAM++ (Chattopadhyay et al. 2018)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import GradientCam, register
from inspect_model.methods.cam.maths import EPS

if TYPE_CHECKING:
    import torch


@register
class GradCamPlusPlus(GradientCam):
    name, title, paper, order = "gradcam++", "Grad-CAM++", "Chattopadhyay et al. 2018", 20
    aliases = ("gradcampp", "gradcamplusplus")

    def weigh(self, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        # Eq. 19 with Y = exp(S): the exp(S) factors cancel in alpha, and the one left in the
        # weights only scales the map (and overflows for large scores), so it is dropped as
        # pytorch-grad-cam does.
        import torch

        sp = tuple(range(2, A.dim()))
        g2 = G * G
        g3 = g2 * G
        sum_a = A.sum(dim=sp, keepdim=True)
        alpha = g2 / (2 * g2 + sum_a * g3 + EPS)
        alpha = torch.where(G != 0, alpha, torch.zeros_like(alpha))
        w = (torch.relu(G) * alpha).sum(dim=sp, keepdim=True)
        return (w * A).sum(dim=1)
