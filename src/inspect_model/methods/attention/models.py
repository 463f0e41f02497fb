"""What the attention methods need to know of a model family: its token layout and its head.

- :func:`patch_grid`: the (rows, columns) of the patch tokens, from their count and the input.
- :func:`block_of`: the transformer block an attention module sits in (its output is the
  token sequence LeGrad scores).
- :func:`score_projection`: intermediate tokens (B, N, D) -> class scores (B, classes), as the
  model's own head would compute them (torch-cam's LeGrad ``score_projection``): torchvision's
  ViT as torch-cam 0.5 does it (the head on the layer-normed *mean* token), timm through
  ``forward_head(norm(x))`` (timm Swin: on the last stage's (B, H, W, C) map), torchvision's
  Swin and MaxViT through their own norm, pooling and head on the last stage's map, HF
  ViT/DeiT through the final layer norm and the classifier on the class token, HF CLIP
  classification on the mean patch token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelRuntimeError, UnsupportedModelError

if TYPE_CHECKING:
    import torch
    from torch import nn

Projection = Callable[["torch.Tensor"], "torch.Tensor"]


def patch_grid(n: int, hw: tuple[int, int]) -> tuple[int, int]:
    """The (rows, columns) of ``n`` patch tokens for an input of ``hw`` pixels: the factor
    pair whose aspect is nearest the input's."""
    if n < 1:
        raise ModelRuntimeError("the attention has no patch tokens left after the prefix tokens")
    aspect = hw[0] / max(hw[1], 1)
    best = (n, 1)
    for rows in range(1, n + 1):
        if n % rows == 0:
            cols = n // rows
            if abs(math.log(rows / cols / aspect)) < abs(math.log(best[0] / best[1] / aspect)):
                best = (rows, cols)
    return best


def block_of(model: nn.Module, attn_name: str) -> str:
    """The nearest ancestor of ``attn_name`` that is an item of a ModuleList/Sequential
    (``encoder.layers.encoder_layer_3``, ``blocks.3``, ``vit.encoder.layer.3``)."""
    from torch import nn as tnn

    modules = dict(model.named_modules())
    parts = attn_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:cut - 1])
        if isinstance(modules.get(parent, model if not parent else None), tnn.ModuleList | tnn.Sequential):
            return ".".join(parts[:cut])
    raise UnsupportedModelError(f"attention module '{attn_name}' is not inside a list of transformer blocks; "
                                "-m raw,rollout,grad-rollout need none")


def _get(model: Any, path: str) -> Any:
    for part in path.split("."):
        model = getattr(model, part, None)
        if model is None:
            return None
    return model


def score_projection(model: nn.Module) -> Projection | None:
    """Intermediate tokens -> class scores through the model's own head (module docstring);
    ``None`` for a family this does not know."""
    import torch

    heads, ln = _get(model, "heads"), _get(model, "encoder.ln")
    if heads is not None and ln is not None and hasattr(model, "conv_proj"):
        return lambda t: heads(ln(t.mean(dim=1)))  # torchvision ViT, as torch-cam 0.5
    if all(hasattr(model, a) for a in ("features", "norm", "permute", "avgpool", "flatten", "head")):
        return lambda t: model.head(model.flatten(model.avgpool(model.permute(model.norm(t)))))  # torchvision Swin
    if all(hasattr(model, a) for a in ("stem", "blocks", "classifier")) and hasattr(model, "partition_size"):
        return lambda t: model.classifier(t)  # torchvision MaxViT: pool, norm, MLP head over (B, C, H, W)
    if callable(getattr(model, "forward_head", None)) and isinstance(getattr(model, "norm", None), torch.nn.Module):
        return lambda t: model.forward_head(model.norm(t))  # timm
    base = next((getattr(model, a) for a in ("vit", "deit") if hasattr(model, a)), None)
    norm = getattr(base, "layernorm", None)
    if norm is not None and hasattr(model, "cls_classifier") and hasattr(model, "distillation_classifier"):
        return lambda t: (model.cls_classifier(norm(t)[:, 0]) + model.distillation_classifier(norm(t)[:, 1])) / 2
    if norm is not None and isinstance(getattr(model, "classifier", None), torch.nn.Module):
        return lambda t: model.classifier(norm(t)[:, 0])  # HF ViT / DeiT
    if hasattr(model, "vision_model") and isinstance(getattr(model, "classifier", None), torch.nn.Module):
        return lambda t: model.classifier(t[:, 1:].mean(dim=1))  # HF CLIPForImageClassification
    return None


def model_scores(output: Any) -> torch.Tensor:
    """The class scores of a model's output: a tensor, HF's ``logits``, or a tuple's first;
    a single score per input (a binary classifier's (N,) logit) as one class, (N, 1)."""
    import torch

    logits = getattr(output, "logits", None)
    if isinstance(output, torch.Tensor):
        scores = output
    elif isinstance(logits, torch.Tensor):
        scores = logits
    elif isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        scores = output[0]
    else:
        scores = None
    if scores is not None:
        return scores[:, None] if scores.dim() == 1 else scores
    raise ModelRuntimeError(f"the model returned {type(output).__name__}; attention methods need class scores")


def tokens_of(output: Any) -> torch.Tensor:
    """A block's output tokens: the tensor, or the first item of a tuple (HF layers)."""
    import torch

    t = output[0] if isinstance(output, tuple | list) else output
    if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):  # 4: a Swin/MaxViT feature map
        raise ModelRuntimeError("a transformer block returned no (batch, tokens, features) tensor")
    return t
