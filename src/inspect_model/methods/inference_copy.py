"""Many no-grad forward passes of one model (Score-CAM's masked inputs, the perturbed inputs
of ``cam --evaluate``): run them on a copy made for inference, checked against the model.

Two kinds of copy, the first that works is used:

1. a frozen TorchScript trace (``torch.jit.trace`` + ``freeze`` + ``optimize_for_inference``):
   BatchNorm folded, weights pre-packed for oneDNN, convolution + ReLU (+ add) fused. It is
   refused when tracing warns (control flow on tensor values, which a trace would bake in).
   On this CPU it is 1.2-1.3x faster per no-grad pass of resnet50 than the model as it is;
2. a ``torch.fx`` copy with every BatchNorm folded into the convolution before it (``fuse``)
   and weights and inputs in channels_last layout.

Both are copies: the user's model is not touched, and the trace runs the model's forward once
on the first batch, which the caller runs anyway. A copy that disagrees with the model on the
first batch (probabilities beyond 1e-4) is dropped, and the model runs as it is. Only worth it
when many passes follow: a copy costs a trace and a copy of the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inspect_model.methods.objectives.targets import class_probabilities

if TYPE_CHECKING:
    import torch
    from torch import nn

MIN_INPUTS = 256  # fewer inputs than this: the copy does not pay for itself (a trace and a weight copy)
AGREE = 1e-4  # largest difference of the probabilities (copy against model) on the first batch


class InferenceRunner:
    """``probs(x)``: the class probabilities (softmax; a single score's sigmoid) of the model
    on ``x`` (B, ...) under no grad; the first call decides whether the fused copy is used
    (and checks it)."""

    def __init__(self, model: nn.Module, forward: Callable[[torch.Tensor], Any],
                 scores: Callable[[Any], torch.Tensor], inputs: int) -> None:
        """``forward(x)``: the model's own pass (with the caller's error handling);
        ``scores(out)``: the (B, classes) scores in its output; ``inputs``: how many inputs
        will be run in all."""
        self.model, self.forward, self.scores = model, forward, scores
        self.fast: nn.Module | None = None
        self.decided = inputs < MIN_INPUTS
        self.used_copy = False

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            if not self.decided:
                self.decided = True
                want = class_probabilities(self.scores(self.forward(x)).float())
                self.fast = traced_copy(self.model, x) or fused_copy(self.model)
                if self.fast is not None:
                    got = self._fast(x)
                    if got.shape != want.shape or not bool(((got - want).abs() <= AGREE).all()):
                        self.fast = None
                self.used_copy = self.fast is not None
                return want
            if self.fast is not None:
                return self._fast(x)
            return class_probabilities(self.scores(self.forward(x)).float())

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        assert self.fast is not None
        if x.dim() == 4 and not isinstance(self.fast, torch.jit.ScriptModule):
            x = x.contiguous(memory_format=torch.channels_last)
        return class_probabilities(self.scores(self.fast(x)).float())


def fused_copy(model: nn.Module) -> nn.Module | None:
    """The inference copy (BatchNorm folded, channels_last), or None when the model cannot be
    traced or holds something the copy would lose (hooks of the user's own)."""
    import warnings

    import torch

    if model.training or any(_has_hooks(m) for m in model.modules()):
        return None
    try:
        from torch.fx.experimental.optimization import fuse

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast = fuse(model, inplace=False)  # traces, then deep-copies the traced graph
        return fast.to(memory_format=torch.channels_last).eval()
    except Exception:  # noqa: BLE001 - any model fx cannot trace (control flow on values, ...) runs as it is
        return None


def traced_copy(model: nn.Module, x: torch.Tensor) -> nn.Module | None:
    """The frozen TorchScript copy, traced on ``x``; None when the model cannot be traced
    faithfully (a TracerWarning: a Python value taken from a tensor), is in training mode or
    holds hooks of the user's own. The caller checks it against the model on ``x``."""
    import warnings

    import torch

    if model.training or any(_has_hooks(m) for m in model.modules()):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            traced = torch.jit.trace(model, x, check_trace=False, strict=False)
            frozen = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
        return frozen
    except Exception:  # noqa: BLE001 - anything TorchScript cannot take (or warns about) runs another way
        return None


def _has_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or getattr(m, "_forward_hooks_with_kwargs", None))
