"""Guided backpropagation (Springenberg et al. 2015) as an attribution: the gradient under
the guided rule (:class:`inspect_model.methods.guided.backprop.GuidedBackwardMode`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.methods.attributions.base import AttributionMethod, register

if TYPE_CHECKING:
    import torch


@register
class Guided(AttributionMethod):
    name, title, paper, order = "guided", "Guided Backprop", "Springenberg et al. 2015", 70
    aliases = ("guided-backprop",)
    smoothable = True

    def compute(self, run: Any) -> torch.Tensor:
        from inspect_model.methods.attributions import sweeps as sw

        out, run.result.guided_sites = sw.gradient_pass(run.b, {"guided": "grad"}, noisy=self.name in run.smoothed,
                                                        guided=True)
        if not run.result.guided_sites:
            run.result.warnings.append("guided: the model has no ReLU on the path to the output; the guided map is "
                                       "the plain gradient")
        return out["guided"]
