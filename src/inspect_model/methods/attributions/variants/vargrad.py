"""VarGrad (Adebayo et al. 2018): the variance of the gradient over noisy copies (captum's
NoiseTunnel: E[g^2] - E[g]^2)."""

from __future__ import annotations

from inspect_model.methods.attributions.base import AttributionMethod, register


@register
class VarGrad(AttributionMethod):
    name, title, paper, order = "vargrad", "VarGrad", "Adebayo et al. 2018", 50
    signed, gradient_rule, noisy = False, "var", True
