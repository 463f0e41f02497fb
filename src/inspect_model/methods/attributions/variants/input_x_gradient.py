"""Input x gradient (Shrikumar et al. 2016): x * d score / d x."""

from __future__ import annotations

from inspect_model.methods.attributions.base import AttributionMethod, register


@register
class InputXGradient(AttributionMethod):
    name, title, paper, order = "input-x-gradient", "Input x Gradient", "Shrikumar et al. 2016", 20
    generation = "gradient"
    aliases = ("ixg", "input-x-gradients")
    smoothable, gradient_rule = True, "input-x-grad"
