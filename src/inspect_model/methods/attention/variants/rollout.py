"""Attention rollout (Abnar & Zuidema, ACL 2020, "Quantifying attention flow"): heads fused
(mean/max/min), the lowest ``discard_ratio`` of each fused map dropped (vit-explain's
variant; the class token's own column is kept), Â = (A + I) / 2 with rows renormalised,
R = Â_L ... Â_1 kept as one running (tokens x tokens) product; the map is the class row
(the mean row without a class token). Windowed models fold window blocks instead
(:mod:`..hierarchical`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.methods.attention.base import AttentionMethod, register

if TYPE_CHECKING:
    import torch


def rollout_step(r: torch.Tensor | None, a: torch.Tensor, fusion: str, discard_ratio: float) -> torch.Tensor:
    """One layer of attention rollout: R <- Â R with Â = norm((fuse(A) + I) / 2).

    ``a`` (B, h, N, N); ``r`` (B, N, N) or ``None`` (identity)."""
    import torch

    from inspect_model.methods.attention.maps import fuse_heads

    fused = fuse_heads(a, fusion)
    if discard_ratio > 0:
        flat = fused.reshape(fused.shape[0], -1).clone()
        k = int(flat.shape[1] * discard_ratio)
        if k:
            low = flat.topk(k, dim=1, largest=False).indices
            keep0 = flat[:, 0].clone()  # the class token's attention to itself stays (vit-explain)
            flat.scatter_(1, low, 0.0)
            flat[:, 0] = keep0
        fused = flat.reshape_as(fused)
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    ahat = (fused + eye) / 2
    ahat = ahat / ahat.sum(dim=-1, keepdim=True)
    return ahat if r is None else torch.bmm(ahat, r)


@register
class Rollout(AttentionMethod):
    name, title, paper, order = "rollout", "attention rollout", "Abnar & Zuidema 2020", 20
    text = True
    class_independent = True
    all_layers = True

    def forward(self, st: Any, call: Any) -> None:
        st.rollout = rollout_step(st.rollout, call.probs(), st.opts.head_fusion, st.opts.discard_ratio)

    def text_forward(self, st: Any, call: Any, probs: torch.Tensor) -> None:
        st.rollout = rollout_step(st.rollout, probs, st.opts.head_fusion, st.opts.discard_ratio)

    def text_result(self, st: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return None, (None if st.rollout is None else st.rollout.float().cpu())  # (B, L, L)

    def forward_windowed(self, st: Any, call: Any) -> None:
        from inspect_model.methods.attention.hierarchical import fused_blocks

        st.wblocks[call.index] = fused_blocks(call.probs(), st.wlayers[-1], st.batch, st.opts.head_fusion,
                                              st.opts.discard_ratio)

    def result(self, st: Any, to_grid: Any) -> torch.Tensor | None:
        if st.wlayers:  # windowed (Swin, MaxViT): on the first attention layer's feature map
            from inspect_model.methods.attention.hierarchical import fold

            return fold(st.wlayers, st.wblocks, st.batch, residual=False)
        if st.rollout is None:
            return None
        r = st.rollout  # (B, N, N)
        return to_grid(r[:, 0] if st.prefix else r.mean(dim=1))
