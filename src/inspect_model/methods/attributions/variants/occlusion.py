"""Occlusion (Zeiler & Fergus 2014; captum ``Occlusion``): f(x) - f(x with a window replaced
by the baseline), averaged over the windows covering each element."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError
from inspect_model.methods.attributions.base import AttributionMethod, register

if TYPE_CHECKING:
    import torch


@register
class Occlusion(AttributionMethod):
    name, title, paper, order = "occlusion", "Occlusion", "Zeiler & Fergus 2014", 60
    generation = "occlusion"
    needs_gradients, needs_baseline = False, True

    def compute(self, run: Any) -> torch.Tensor:
        from inspect_model.methods.attributions import passes as ap
        from inspect_model.methods.attributions import sweeps as sw

        b, st = run.b, run.b.settings
        sample = tuple(b.x.shape[1:])
        window = ap.window_shape(st.window, sample, space=run.space)
        if any(w > d for w, d in zip(window, sample)):
            given = ",".join(map(str, st.window))
            raise UsageError(f"--window {given} ({'x'.join(map(str, window))} on this input) is larger than the "
                             f"input {sample}; give a window no larger than {'x'.join(map(str, sample[-2:]))}")
        default_stride = tuple(max(w // 2, 1) for w in st.window)
        stride = ap.window_shape(st.stride, sample, space=run.space, what="--window-stride", default=default_stride)
        return sw.occlusion_pass(b, run.baseline, run.fx, window, stride)
