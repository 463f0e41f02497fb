"""What a model's first layer expects: the hint that turns a failed first layer into an
input-size error (exit 4) with the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def first_layer_hint(model: nn.Module) -> tuple[str, str] | None:
    """What the first conv/linear layer expects, e.g. "the first layer 'conv1' (Conv2d)
    expects 3 input channels and a 4-D input (N, C, H, W)": the fix for a wrong input size."""
    from torch import nn

    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            rank = {nn.Conv1d: 3, nn.Conv2d: 4, nn.Conv3d: 5}[type(mod)] if type(mod) in (
                nn.Conv1d, nn.Conv2d, nn.Conv3d) else 4
            dims = {3: "(N, C, L)", 4: "(N, C, H, W)", 5: "(N, C, T, H, W)"}[rank]
            return name, (f"the first layer '{name}' ({type(mod).__name__}) expects {mod.in_channels} "
                          f"input channels and a {rank}-D input {dims}; set --input-size accordingly")
        if isinstance(mod, nn.Linear):
            return name, (f"the first layer '{name}' (Linear) expects {mod.in_features} features in the "
                          "last dimension; set --input-size accordingly")
        if isinstance(mod, nn.Embedding):
            return name, f"the first layer '{name}' (Embedding) expects integer token ids"
    return None


def _expected_image_size(model: nn.Module) -> tuple[int, str | None] | None:
    """The square image size a fixed-size vision transformer takes, and the builder argument
    that changes it: torchvision's ``image_size``, timm's ``img_size``, a HF config's (none)."""
    size = getattr(model, "image_size", None)
    if isinstance(size, int):
        return size, "image_size"  # torchvision's VisionTransformer
    patch = getattr(model, "patch_embed", None)
    img = getattr(patch, "img_size", None)
    if isinstance(img, (tuple, list)) and img and isinstance(img[0], int):
        return int(img[0]), "img_size"  # timm
    cfg = getattr(getattr(model, "config", None), "image_size", None)
    if isinstance(cfg, int):
        return cfg, None  # transformers: the size is in config.json
    return None


def size_hint(model: nn.Module, message: str) -> str | None:
    """For a model that takes one image size (ViT) and an error about the size: what it
    takes and the two ways to fix it (issue 39), instead of a channels-and-rank hint that
    the input already met. ``None`` when the error is not about the size."""
    import re

    found = _expected_image_size(model)
    low = message.lower()
    if found is None or not any(w in low for w in ("height", "width", "image size", "doesn't match", "size")):
        return None
    size, arg = found
    got = re.search(r"expected \d+ but got (\d+)|\((\d+)\) doesn't match|size \((\d+)\*", low)
    g = next((x for x in got.groups() if x), None) if got else None
    text = f"the model takes {size}x{size} images" + (f", not {g}x{g}" if g and int(g) != size else "")
    text += f": give --input-size 3x{size}x{size} (with image files, --crop {size} or no --crop)"
    if arg:
        text += f", or build it for your size with --weights none --model-arg {arg}={g or 'SIZE'}"
    return text
