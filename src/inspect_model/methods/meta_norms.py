"""Normalisation ops on the meta device without torch's Python decompositions.

``summary`` runs a model on the meta device under a dispatch mode that counts MACs. torch
has no native meta kernel for batch, layer and group norm: it runs their Python
decompositions (mean, variance, type promotion: dozens of reference ops each), a quarter of
a summary's time on a network with a norm in every block. Their outputs are fresh tensors
whose shapes, dtypes and strides follow from the inputs, so they are made here directly;
anything unusual (another device, a missing running statistic in eval mode, an overload not
listed) goes to torch. tests/unit/methods/test_meta_norms.py checks every case against
torch's own meta outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _stats_dtype(x: Any) -> Any:
    import torch

    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _like(x: Any) -> Any:
    """``torch.empty_like(x)`` (its layout kept: channels-last stays channels-last): through
    ``empty_strided`` when ``x`` is dense, 10x faster than ``empty_like``'s Python meta."""
    import torch

    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return torch.empty_like(x)


def _empty(shape: Any, dtype: Any, device: Any) -> Any:
    import torch

    return torch.empty(shape, dtype=dtype, device=device)


def _batch_norm(x: Any, training: bool, have_stats: bool) -> tuple | None:
    if x.dim() < 2 or not (training or have_stats) or (training and have_stats and x.numel() <= x.shape[1]):
        return None  # torch says what is wrong (one value per channel: its unbiased variance divides by 0)
    stats, dtype = (x.shape[1],), _stats_dtype(x)
    return _like(x), _empty(stats, dtype, x.device), _empty(stats, dtype, x.device)


def _native_batch_norm(x: Any, w: Any, b: Any, mean: Any, var: Any, training: bool, *rest: Any) -> tuple | None:
    return _batch_norm(x, training, mean is not None and var is not None)


def _no_stats(x: Any, w: Any, b: Any, training: bool, *rest: Any) -> tuple | None:
    return _batch_norm(x, training, False)


def _no_training(x: Any, *rest: Any) -> tuple | None:
    return _batch_norm(x, False, True)


def _layer_norm(x: Any, shape: Any, *rest: Any) -> tuple | None:
    axis = x.dim() - len(shape)
    if axis < 0 or tuple(x.shape[axis:]) != tuple(shape):
        return None
    stats, dtype = (*x.shape[:axis], *([1] * len(shape))), _stats_dtype(x)
    return _empty(x.shape, x.dtype, x.device), _empty(stats, dtype, x.device), _empty(stats, dtype, x.device)


def _group_norm(x: Any, w: Any, b: Any, n: int, c: int, hw: int, groups: int, *rest: Any) -> tuple | None:
    if x.dim() < 2 or groups <= 0 or x.shape[1] % groups or n != x.shape[0]:
        return None
    return _empty(x.shape, x.dtype, x.device), _empty((n, groups), x.dtype, x.device), _empty((n, groups), x.dtype, x.device)


def _table() -> dict[Any, Callable[..., tuple | None]]:
    import torch

    aten = torch.ops.aten
    return {aten.native_batch_norm.default: _native_batch_norm,
            aten._native_batch_norm_legit.default: _native_batch_norm,
            aten._native_batch_norm_legit.no_stats: _no_stats,
            aten._native_batch_norm_legit_no_training.default: _no_training,
            aten.native_layer_norm.default: _layer_norm,
            aten.native_group_norm.default: _group_norm}


_TABLE: dict[Any, Callable[..., tuple | None]] | None = None


def meta_norm(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The outputs of ``func(*args)`` when it is a norm listed here and its input lies on
    the meta device, else None (then torch runs it)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    make = _TABLE.get(func)
    if make is None or kwargs or not args or getattr(args[0], "device", None) is None or args[0].device.type != "meta":
        return None
    return make(*args)
