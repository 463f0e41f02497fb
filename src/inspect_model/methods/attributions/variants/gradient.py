"""The plain gradient d score / d x, signed."""

from __future__ import annotations

from inspect_model.methods.attributions.base import AttributionMethod, register


@register
class Gradient(AttributionMethod):
    name, title, paper, order = "gradient", "Gradient", "Simonyan et al. 2014", 10
    generation = "gradient"
    aliases = ("gradients",)
    smoothable, gradient_rule = True, "grad"
