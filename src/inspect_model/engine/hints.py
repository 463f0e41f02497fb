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
