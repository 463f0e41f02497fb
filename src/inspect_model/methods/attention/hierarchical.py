"""Rollout and gradient rollout through windowed, hierarchical transformers (Swin, MaxViT).

A windowed layer at an (H, W) feature map attends within groups of tokens (Swin's shifted
windows, MaxViT's blocks and grids): the op sees (B * G, heads, N, N). As a (HW x HW)
operator on the feature map that is M = P^T blockdiag(A_1 .. A_G) P, with P the permutation
(padding, cyclic shift, partition) that takes the map's tokens to the window tokens
(:func:`~inspect_model.methods.attention.windows.positions`). Between stages the map is
merged (Swin's 2x2 patch merging, MaxViT's stride-2 MBConv): a coarse token is the mean of
the fine tokens it covers, the row-stochastic pooling operator D (h w x H W).

Rollout is then R = Â_L ... D ... Â_1 with Â = norm((fuse(A) + I) / 2) block by block, and
grad-rollout R = (I + Ā_L) ... D ... (I + Ā_1) with Ā = E_h[(∇A ⊙ A)^+] (Chefer et al.
2021, eq. 5-6). These models have no class token; their head averages the last stage's
tokens, so the map is the mean row of R: u^T R with u uniform over the last layer's tokens.
It is computed from the end, u <- u Â_l, one (B, HW) vector at a time, so no (HW x HW)
matrix is ever formed: each layer keeps only its fused (B, G, N, N) window blocks
(tokens x window area numbers per image, what the op computed anyway). The map lies on the
first attention layer's feature map. The convolutions and MLPs between attention layers are
taken as the identity, as rollout takes a ViT's MLPs. The methods fold with :func:`fold` at
their end (methods/attention/variants/rollout.py, grad_rollout.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UnsupportedModelError

if TYPE_CHECKING:
    import torch


@dataclass
class WindowLayer:
    """One windowed attention call: its feature map and where its window tokens lie on it."""

    index: int  # call order in the forward pass
    name: str
    hw: tuple[int, int]
    pos: torch.Tensor  # (G * N,) long, -1 for padding
    groups: int
    n: int


def fused_blocks(a: torch.Tensor, layer: WindowLayer, batch: int, fusion: str, discard_ratio: float) -> torch.Tensor:
    """(B * G, h, N, N) probabilities -> (B, G, N, N) blocks of Â = norm((fuse(A) + I) / 2)
    over the map's own tokens: the padding's columns are cut first (the dense matrix is the
    layer's attention among the image's tokens). ``discard_ratio`` drops the lowest entries
    of each image's blocks."""
    import torch

    from inspect_model.methods.attention.maps import fuse_heads

    fused = fuse_heads(a, fusion)  # (B * G, N, N)
    n = fused.shape[-1]
    real = (layer.pos >= 0).reshape(1, layer.groups, 1, n).to(device=fused.device, dtype=fused.dtype)
    fused = fused.reshape(batch, -1, n, n) * real
    if discard_ratio > 0:
        flat = fused.reshape(batch, -1).clone()
        k = int(flat.shape[1] * discard_ratio)
        if k:
            flat.scatter_(1, flat.topk(k, dim=1, largest=False).indices, 0.0)
        fused = flat.reshape_as(fused)
    ahat = (fused + torch.eye(n, dtype=fused.dtype, device=fused.device)) / 2
    return ahat / ahat.sum(dim=-1, keepdim=True)


def unpool(u: torch.Tensor, coarse: tuple[int, int], fine: tuple[int, int]) -> torch.Tensor:
    """u^T D: (B, h*w) on the coarse map -> (B, H*W) on the fine one, D averaging the fine
    tokens each coarse token covers (fine (i, j) under coarse (i // f, j // f), f = ceil(H / h))."""
    import torch

    (h, w), (hh, ww) = coarse, fine
    if hh < h or ww < w:
        raise UnsupportedModelError(f"attention on a {h}x{w} map follows one on a {hh}x{ww} map: rollout "
                                    "follows maps that shrink (patch merging), not ones that grow; -m raw works")
    fh, fw = -(-hh // h), -(-ww // w)
    rows = (torch.arange(hh) // fh).clamp(max=h - 1)
    cols = (torch.arange(ww) // fw).clamp(max=w - 1)
    parent = (rows[:, None] * w + cols[None, :]).reshape(-1).to(u.device)  # (H*W,)
    count = torch.bincount(parent, minlength=h * w).to(u.dtype)
    return u[:, parent] / count[parent]


def fold(layers: list[WindowLayer], blocks: dict[int, torch.Tensor], batch: int, *,
         residual: bool) -> torch.Tensor:
    """u^T M_L ... D ... M_1 from u uniform on the last layer's map (module docstring):
    M = Â (``residual=False``, blocks already hold the identity) or I + Ā (``residual=True``).
    ``blocks``: call index -> (B, G, N, N). Returns (B, H_1, W_1)."""
    import torch

    last = layers[-1]
    cur = last.hw
    u = torch.full((batch, cur[0] * cur[1]), 1.0 / (cur[0] * cur[1]), dtype=torch.float64)
    for layer in reversed(layers):
        if layer.hw != cur:
            u = unpool(u, cur, layer.hw)
            cur = layer.hw
        hw = cur[0] * cur[1]
        mats = blocks[layer.index].to(torch.float64).cpu()
        idx = torch.where(layer.pos < 0, hw, layer.pos)  # padding reads and writes a dump slot
        padded = torch.cat([u, u.new_zeros(batch, 1)], dim=1)
        windows = padded[:, idx].reshape(batch, layer.groups, 1, layer.n)
        moved = torch.matmul(windows, mats).reshape(batch, -1)  # (B, G * N): u restricted, times the blocks
        out = padded.new_zeros(batch, hw + 1).index_add_(1, idx, moved)[:, :hw]
        u = u + out if residual else out
    return u.reshape(batch, *cur).float()


def window_layer(call: Any, owner: Any, batch: int) -> WindowLayer:
    """The :class:`WindowLayer` of a windowed attention call (``call``: an ``AttentionCall``,
    ``owner``: its ``WindowOwner``, holding the feature map of this call)."""
    from inspect_model.methods.attention.windows import positions

    groups, n = call.batch // batch, call.queries
    return WindowLayer(call.index, call.name, tuple(owner.hw), positions(owner, groups, n), groups, n)
