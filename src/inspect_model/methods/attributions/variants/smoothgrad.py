"""SmoothGrad (Smilkov et al. 2017): the mean gradient over noisy copies x + N(0, sigma^2)."""

from __future__ import annotations

from inspect_model.methods.attributions.base import AttributionMethod, register


@register
class SmoothGrad(AttributionMethod):
    name, title, paper, order = "smoothgrad", "SmoothGrad", "Smilkov et al. 2017", 40
    gradient_rule, noisy = "grad", True
