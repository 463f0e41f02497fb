"""What a subcommand feeds the model, one batch at a time (its own module: the image plans
of :mod:`inspect_model.loading.inputs` and the clip and pair plans of
:mod:`inspect_model.loading.clips` and :mod:`inspect_model.loading.pairs` all yield it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from inspect_model.loading.images import LoadedImage


@dataclass
class InputBatch:
    """What a subcommand feeds the model: images, or a seeded random/zero tensor."""

    tensor: torch.Tensor  # (N, C, H, W) on the run's device and dtype
    names: list[str]  # image paths, or "random-0", ...
    images: list[LoadedImage] | None  # None for synthetic input
    text: Any = None  # loading.text.TextBatch when the tensor is token ids of texts (--text)
