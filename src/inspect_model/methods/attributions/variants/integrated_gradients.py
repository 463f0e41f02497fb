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
    generation = "integrated"
    aliases = ("ig",)
    smoothable, needs_baseline = True, True

    def compute(self, run: Any) -> torch.Tensor:
        from inspect_model.methods.attributions import passes as ap
        from inspect_model.methods.attributions import sweeps as sw

        b, base, res = run.b, run.baseline, run.result
        st, (n, k) = b.settings, run.shape
        noisy = self.name in run.smoothed
        if st.steps == "auto":  # f(b) first: each map stops refining once its gap is small enough
            fb = sw.forward_scores(b, base)
            maps, used = sw.ig_auto(b, base, run.fx, fb)
        else:
            maps = sw.ig_pass(b, base, noisy=noisy)
            fb = sw.forward_scores(b, base)
            used = [len(ap.integration_rule(st.rule, int(st.steps))[0])] * b.units
        f_end = sw.forward_scores(b, b.x, noisy=True) if noisy else run.fx
        sums = maps.reshape(b.units, -1).double().sum(1).cpu()
        res.baseline_scores = fb.reshape(n, k).tolist()
        res.deltas = (sums - (f_end - fb)).reshape(n, k).tolist()
        res.ig_steps = [used[i * k:(i + 1) * k] for i in range(n)]  # the steps each map took
        return maps
