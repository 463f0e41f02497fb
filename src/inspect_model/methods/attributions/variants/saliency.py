"""Saliency (Simonyan et al. 2014): |d score / d x| (captum ``Saliency(abs=True)``)."""

from __future__ import annotations

from inspect_model.methods.attributions.base import AttributionMethod, register


@register
class Saliency(AttributionMethod):
    name, title, paper, order = "saliency", "Saliency", "Simonyan et al. 2014", 0
    generation = "gradient"
    signed, smoothable, gradient_rule = False, True, "abs"
