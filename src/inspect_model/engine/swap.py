"""Borrow a model's parameters and buffers: swap in stand-ins (meta copies), always give back.

``torch.func.functional_call(tie_weights=True)`` raises NotImplementedError on a module
registered under several names (pytorch/pytorch#164759) and can leave the swapped tensors
in place when it fails. Here each tensor *object* gets one stand-in, so every name that
shares it (ties, a module placed four times in a Sequential) sees the same stand-in, and the
originals are put back in ``finally``, whatever the forward pass did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn


@contextmanager
def swapped_tensors(model: nn.Module, make: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Within the block, every parameter and buffer ``t`` of ``model`` reads as ``make(t)``
    (one stand-in per tensor object, so shared tensors stay shared); restored on exit.
    Plain tensor attributes a forward pass may replace (torchvision's ``AnchorGenerator``
    caches ``cell_anchors`` on the device it last ran on: meta) are put back too."""
    import torch
    from torch import nn

    stand_in: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict[str, torch.Tensor | None], str, torch.Tensor]] = []
    plain = [(mod.__dict__, k, v) for mod in model.modules() for k, v in list(vars(mod).items())
             if not k.startswith("_") and (isinstance(v, torch.Tensor) or (
                 isinstance(v, (list, tuple)) and v and all(isinstance(e, torch.Tensor) for e in v)))]

    def replacement(t: torch.Tensor, is_param: bool) -> torch.Tensor:
        if id(t) not in stand_in:
            new = make(t)
            if is_param and not isinstance(new, nn.Parameter):
                new = nn.Parameter(new, requires_grad=t.requires_grad)
            stand_in[id(t)] = new
        return stand_in[id(t)]

    try:
        for mod in model.modules():  # each module object once, however many names it has
            for store, is_param in ((mod._parameters, True), (mod._buffers, False)):
                for key, t in list(store.items()):
                    if t is None:
                        continue
                    new = replacement(t, is_param)
                    saved.append((store, key, t))
                    store[key] = new
        yield
    finally:
        for store, key, t in reversed(saved):
            store[key] = t
        for attrs, key, value in plain:
            attrs[key] = value
