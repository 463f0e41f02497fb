"""Windowed attention (Swin) mapped back onto the feature map.

MaxViT (torchvision) cuts its (B, C, H, W) map into P x P windows and attends within each
window ("block" attention) or, with the two axes swapped, across windows among the tokens
at one place of every window ("grid" attention); both are put back the same way.

A Swin block pads its (B, H, W, C) feature map to whole windows, shifts it cyclically by
``shift_size``, cuts it into windows of ``window_size`` and attends within each window: the
attention op sees (B * windows, heads, N, N) with N = window area. What a token receives,
averaged over the queries of its window, is put back where the token came from: windows
reassembled (the inverse of ``window_partition``), the shift undone, the padding cut.
torchvision pads before it shifts (and drops a shift that a single window covers); timm
shifts before it pads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class WindowOwner:
    """The module that partitions (torchvision ``ShiftedWindowAttention``, timm ``SwinTransformerBlock``)."""

    name: str
    module: Any
    torchvision: bool
    hw: tuple[int, int] | None = None  # the feature map of its latest call
    maxvit: str = ""  # "window" or "grid" for a torchvision MaxViT PartitionAttentionLayer


def window_owner(model: nn.Module, attn_name: str) -> WindowOwner | None:
    """The module holding ``window_size``/``shift_size`` for the attention module ``attn_name``:
    the module itself (torchvision) or its parent (timm); ``None`` when neither does."""
    modules = dict(model.named_modules())
    parts = attn_name.split(".")
    parent, grand = ".".join(parts[:-1]), ".".join(parts[:-2])
    for name in (attn_name, parent):
        m = modules.get(name)
        if m is not None and hasattr(m, "window_size") and hasattr(m, "shift_size"):
            return WindowOwner(name, m, name == attn_name)
    m = modules.get(grand)
    if m is not None and hasattr(m, "partition_swap") and hasattr(m, "grid_size") and hasattr(m, "p"):
        grid = type(m.partition_swap).__name__ == "SwapAxes"
        return WindowOwner(grand, m, True, hw=tuple(m.grid_size), maxvit="grid" if grid else "window")
    return None


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    return int(v[0]), int(v[1])


def unpartition(rows: torch.Tensor, batch: int, owner: WindowOwner) -> torch.Tensor:
    """(B * windows, heads, N) received attention per window token -> (B, heads, H, W)."""
    import torch

    assert owner.hw is not None
    h, w = owner.hw
    if owner.maxvit:
        return _maxvit(rows, batch, owner.module.p, h, w, owner.maxvit)
    wh, ww = _pair(owner.module.window_size)
    sh, sw = _pair(owner.module.shift_size)
    ph, pw = h + (wh - h % wh) % wh, w + (ww - w % ww) % ww
    if owner.torchvision:  # a window that covers the whole map is not shifted
        sh, sw = (0 if wh >= ph else sh), (0 if ww >= pw else sw)
    heads = rows.shape[1]
    x = rows.reshape(batch, ph // wh, pw // ww, heads, wh, ww)
    x = x.permute(0, 3, 1, 4, 2, 5).reshape(batch, heads, ph, pw)  # windows reassembled
    if owner.torchvision:  # padded, then shifted: unshift, then crop
        x = torch.roll(x, shifts=(sh, sw), dims=(2, 3))
        return x[:, :, :h, :w]
    x = x[:, :, :h, :w]  # timm: shifted, then padded: crop, then unshift
    return torch.roll(x, shifts=(sh, sw), dims=(2, 3))


def _maxvit(rows: torch.Tensor, batch: int, p: int, h: int, w: int, kind: str) -> torch.Tensor:
    """MaxViT: block attention within P x P windows (token (pi, pj) of window (gi, gj)), grid
    attention across windows (group (pi, pj), token (gi, gj)); pixel (gi P + pi, gj P + pj)."""
    heads = rows.shape[1]
    if kind == "window":  # (B * G, heads, P*P)
        x = rows.reshape(batch, h // p, w // p, heads, p, p).permute(0, 3, 1, 4, 2, 5)
    else:  # (B * P*P, heads, G)
        x = rows.reshape(batch, p, p, heads, h // p, w // p).permute(0, 3, 4, 1, 5, 2)
    return x.reshape(batch, heads, h, w)


def positions(owner: WindowOwner, groups: int, n: int) -> torch.Tensor:
    """(groups * n,) long: the row-major index on the (H, W) feature map of each token the
    attention op sees (window g, token t at g * n + t), -1 for a padding token; the inverse
    of :func:`unpartition`, read off it applied to the window tokens' own indices."""
    import torch

    assert owner.hw is not None
    ids = torch.arange(groups * n, dtype=torch.float64).reshape(groups, 1, n)
    where = unpartition(ids, 1, owner).reshape(-1).long()  # (H*W,): the window token at each place
    pos = torch.full((groups * n,), -1, dtype=torch.long)
    pos[where] = torch.arange(where.numel())
    return pos
