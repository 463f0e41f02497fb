"""Class activation maps over time: the layouts of a video model's layers.

A video model's layer gives (N, C, t, h, w) feature maps (3-D CNNs: r3d, mc3, r(2+1)d, S3D),
(N, t, h, w, C) (torchvision's Swin3D stages) or (N, 1 + t*h*w, D) tokens with a class token
(MViT). :func:`infer_layout3d` names the layout and its (t, h, w) grid;
:func:`~inspect_model.methods.cam.maths.to_spatial` gives the (N, C, t, h, w) view that
the CAM formulas of :mod:`.maths` take: they reduce over every dim after the channels, so Grad-CAM's weights are the mean of the
gradients over (t, h, w) and the maps are (N, t, h, w), upsampled (trilinear) to the clip's
(T, H, W) and normalised over the whole clip, so frames compare on one scale.

An MViT token grid: the temporal size is the input's frames over the stride of the first
3-D convolution (its blocks pool space only), and the spatial grid is what is left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, UsageError
from inspect_model.methods.cam.maths import Layout, token_grid

if TYPE_CHECKING:
    import torch
    from torch import nn


def is_mvit(model: nn.Module) -> bool:
    return type(model).__name__ == "MViT" and hasattr(model, "blocks") and hasattr(model, "conv_proj")


def auto_layer3d(model: nn.Module) -> str | None:
    """``--layer auto`` for video transformers: MViT's last block's first norm (its patch
    tokens reach the class token through that block's attention); RAFT's context encoder; or None."""
    if is_mvit(model):
        return f"blocks.{len(model.blocks) - 1}.norm1"  # type: ignore[arg-type]
    if type(model).__name__ == "RAFT" and hasattr(model, "context_encoder"):
        # The first image's context features (N, C, H/8, W/8); the feature encoder sees both
        # images as one batch of 2N, and the flow head's two channels are the flow itself.
        return "context_encoder"
    return None


def _temporal_stride(model: nn.Module) -> int:
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.Conv3d):
            return int(m.stride[0])
    return 1


def infer_layout3d(model: nn.Module, name: str, shape: tuple[int, ...], input_thw: tuple[int, ...],
                   reshape: Any = None) -> Layout:
    """The layout of a clip layer's (batched) output ``shape``; ``input_thw`` is the clip's
    (T, H, W)."""
    from torch import nn

    if reshape is not None:
        raise UsageError("--reshape applies to image token layers; a video model's token grid is found "
                         "from the model")
    module = dict(model.named_modules()).get(name)
    if len(shape) == 5:
        swin = type(model).__name__.startswith("SwinTransformer3d") and not isinstance(module, nn.Conv3d)
        layout = Layout("nthwc", tuple(shape[1:4]), channels=shape[4]) if swin else \
            Layout("ncthw", tuple(shape[2:5]), channels=shape[1])
        if layout.grid[1] * layout.grid[2] <= 1:
            raise LayerSelectionError(f"layer '{name}' outputs {tuple(shape)}: a 1x1 map has no spatial extent; "
                                      "pick an earlier layer, or use --layer auto")
        return layout
    if len(shape) == 3:
        tokens, dim = shape[1], shape[2]
        T, H, W = input_thw
        ts = _temporal_stride(model)
        candidates = [T // ts] if T % ts == 0 else []
        candidates += [t for t in range(T, 0, -1) if t not in candidates]
        for prefix in (1, 0) if is_mvit(model) else (0, 1):
            n = tokens - prefix
            for t in candidates:
                if n <= 0 or n % t:
                    continue
                found = token_grid(n // t, (H, W), max_prefix=0)
                if found is not None:
                    return Layout("tokens", (t, *found[1]), prefix=prefix, channels=dim)
        raise LayerSelectionError(f"cannot lay the {tokens} tokens of layer '{name}' on a (frames, h, w) grid; "
                                  "pick a layer with (N, C, T, H, W) output")
    raise LayerSelectionError(
        f"layer '{name}' outputs {tuple(shape)}: no extent over frames and space; a clip's activation map "
        "needs (N, C, T, H, W) feature maps or (N, tokens, D) tokens; try --layer auto")


def clip_layout(model: nn.Module, name: str, shape: tuple[int, ...], input_thw: tuple[int, ...]) -> Layout | None:
    """The (t, h, w) layout of a clip layer's output for ``activations``' grids: as for CAM
    (:func:`infer_layout3d`), or None where the output has none (vectors, 1x1 maps)."""
    if len(shape) not in (3, 5):
        return None
    try:
        return infer_layout3d(model, name, shape, input_thw)
    except (LayerSelectionError, UsageError):
        return None


def as_frames(sample: torch.Tensor, layout: Layout) -> torch.Tensor:
    """One clip's output (no batch dim) in ``layout`` as (C, t, h, w): tokens on their grid
    (class token dropped), Swin3D's channels-last stages with channels first."""
    from inspect_model.methods.cam.maths import to_spatial

    return to_spatial(sample[None], layout)[0]


def layout_note(layout: Layout, tokens: int | None = None) -> str:
    """``1568 tokens on an 8x14x14 (frames, h, w) grid, class token dropped`` and the like."""
    grid = "x".join(str(g) for g in layout.grid)
    if layout.kind == "tokens":
        drop = "" if not layout.prefix else ", class token dropped" if layout.prefix == 1 else \
            f", {layout.prefix} leading tokens dropped"
        return f"{tokens if tokens is not None else '?'} tokens on a {grid} (frames, h, w) grid{drop}"
    if layout.kind == "nthwc":
        return f"(frames, h, w, channels) output on a {grid} grid, channels last"
    return f"(channels, frames, h, w) output on a {grid} grid"
