"""Where a model's tensors live: :func:`model_device`, the one copy every layer uses.

It sits at the bottom of the layers, beside :mod:`inspect_model.errors` (pyproject's
import-linter contract), because both the engine (which gives a model back on the device it
found it on) and loading (which moves a freshly built model, and leaves a borrowed one where
it is) need it, and neither of those may import the other. It imports nothing but torch's
types, and those only for type checking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def model_device(model: nn.Module) -> str | None:
    """The device of the model's first parameter (or buffer): ``"cpu"``, ``"cuda:0"``; None
    for a model with neither. A model spread by accelerate (``hf_device_map``: some weights
    on the meta device, on disk) runs its inputs on its main device: the first GPU of its
    table, else the CPU."""
    dmap = getattr(model, "hf_device_map", None)
    if isinstance(dmap, dict) and dmap:
        return placed_device(dmap)
    for t in model.parameters():
        return str(t.device)
    for t in model.buffers():
        return str(t.device)
    return None


def placed_device(dmap: dict) -> str:
    """The main device of an accelerate device table (``{"model.layers.0": 0, ...}``)."""
    gpus = sorted(d for d in dmap.values() if isinstance(d, int) and not isinstance(d, bool))
    if gpus:
        return f"cuda:{gpus[0]}"
    return "mps" if "mps" in dmap.values() else "cpu"


def is_placed(model: object) -> bool:
    """Whether accelerate placed ``model`` (its hooks move weights and inputs; never ``.to()`` it)."""
    return isinstance(getattr(model, "hf_device_map", None), dict)
