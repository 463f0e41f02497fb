"""Quantized models (torchvision.models.quantization, or any model converted by torch.ao):
telling a really quantized model from its float twin, and refusing gradients on it.

``quantized_*`` models are built float by default (``quantize=False``: fused-ready float
modules, QuantStub/DeQuantStub as identities) and run every command. With
``--model-arg quantize=True`` (or quantized weights) torchvision calibrates and converts
them: their kernels are quantized ops, which autograd cannot differentiate, so the gradient
commands refuse in one line. Statistics of quantized tensors are taken on their dequantized
values (engine/hooks.py).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import LayerSelectionError

# Float modules that torch keeps among the quantized ones (a float model prepared for quantization).
FLOAT_MODULES = ("QuantStub", "DeQuantStub", "FloatFunctional")


def quantized_modules(model: Any) -> list[str]:
    """Names of the modules that run quantized kernels (torch.ao.nn.quantized and friends)."""
    import torch

    out = []
    for name, m in model.named_modules():
        mod = type(m).__module__
        if mod.startswith(("torch.ao.nn.quantized", "torch.nn.quantized", "torch.ao.nn.intrinsic.quantized")) \
                and type(m).__name__ not in FLOAT_MODULES:
            out.append(name)
        elif any(isinstance(b, torch.Tensor) and b.is_quantized for b in m.buffers(recurse=False)):
            out.append(name)
    return out


def refuse_gradients(loaded: Any, command: str) -> None:
    """One line for a gradient command (the caller asks its registry entry) on a really
    quantized model."""
    found = quantized_modules(loaded.model)
    if found:
        raise LayerSelectionError(
            f"{loaded.name} is quantized ({len(found)} modules run quantized kernels, e.g. '{found[0] or 'model'}'), "
            f"and quantized kernels have no autograd: `{command}` needs gradients; inspect its float version "
            "(--model-arg quantize=False, the default of torchvision's quantized_* builders)")
