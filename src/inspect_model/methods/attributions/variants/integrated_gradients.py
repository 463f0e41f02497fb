"""Integrated gradients (Sundararajan et al. 2017): (x - b) * integral_0^1 grad(b + a (x - b)) da
by a Riemann or Gauss-Legendre rule, with the completeness gap sum(map) - (f(x) - f(b))."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.methods.attributions.base import AttributionMethod, register

if TYPE_CHECKING:
    import torch


@register
class IntegratedGradients(AttributionMethod):
    name, title, paper, order = "integrated-gradients", "Integrated Gradients", "Sundararajan et al. 2017", 30
    aliases = ("ig",)
    smoothable, needs_baseline = True, True

    def compute(self, run: Any) -> torch.Tensor:
        from inspect_model.methods.attributions import sweeps as sw

        b, base, res = run.b, run.baseline, run.result
        noisy = self.name in run.smoothed
        maps = sw.ig_pass(b, base, noisy=noisy)
        fb = sw.forward_scores(b, base)
        f_end = sw.forward_scores(b, b.x, noisy=True) if noisy else run.fx
        sums = maps.reshape(b.units, -1).double().sum(1).cpu()
        n, k = run.shape
        res.baseline_scores = fb.reshape(n, k).tolist()
        res.deltas = (sums - (f_end - fb)).reshape(n, k).tolist()
        return maps
