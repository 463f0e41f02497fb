"""Gradient rollout (Chefer, Gur & Wolf, ICCV 2021, "Generic attention-model explainability",
eq. 5-6): Ā = E_h[(∇A ⊙ A)^+] with ∇ the target logit's gradient, R = R + Ā R from R = I;
the map is the class row, folded from the output end as the backward pass brings each layer
(u <- u + u Ā), so no (tokens x tokens) product is formed. Its backward pass is the target
score's, shared with the gradient CAMs of the same run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelRuntimeError
from inspect_model.methods.attention.base import AttentionMethod, register

if TYPE_CHECKING:
    import torch


def fold_row(st: Any, index: int, abar: torch.Tensor) -> None:
    """Chefer et al.'s R = (I + Ā_L) ... (I + Ā_1), read only in its class row (the mean row
    without a class token): u^T R from the output end, u <- u + u Ā_l, as the backward pass
    brings the layers, last first. No (tokens x tokens) product is formed."""
    import torch

    if st.gr_row is None:
        n = abar.shape[-1]
        st.gr_row = torch.zeros(st.batch, n, dtype=abar.dtype, device=abar.device)
        if st.prefix:
            st.gr_row[:, 0] = 1.0
        else:
            st.gr_row += 1.0 / n
    elif index >= st.gr_last:
        raise ModelRuntimeError("grad-rollout needs the attention layers in one chain (the backward pass "
                                f"reached layer {index} after layer {st.gr_last})")
    st.gr_row = st.gr_row + torch.bmm(st.gr_row[:, None].to(abar.dtype), abar)[:, 0]
    st.gr_last = index


@register
class GradRollout(AttentionMethod):
    name, title, paper, order = "grad-rollout", "gradient rollout", "Chefer et al. 2021", 30
    text = True
    needs_gradients = True
    score_backward = True
    all_layers = True

    def backward(self, st: Any, call: Any, grad: torch.Tensor) -> None:
        abar = (grad * call.probs()).clamp_min_(0).mean(dim=1)  # (B, N, N); windowed (B * G, N, N)
        if call.name in st.windowed:
            st.abar[call.index] = abar  # folded at the end with the windows (methods/attention/hierarchical.py)
        else:
            fold_row(st, call.index, abar)

    def text_backward(self, st: Any, call: Any, grad: torch.Tensor) -> None:
        st.abar[call.index] = (grad * call.probs()).clamp_min_(0).mean(dim=1)  # (B, L, L)

    def text_result(self, st: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """R = (I + Ā_L) ... (I + Ā_1) whole: a text's map is every query's row (``--query``)."""
        import torch

        n = next(iter(st.abar.values())).shape[-1] if st.abar else 0
        r = torch.eye(n, dtype=torch.float32).expand(len(st.lengths), n, n).clone()
        for i in sorted(st.abar):
            r = r + torch.bmm(st.abar[i].float().cpu(), r)
        return None, r

    def result(self, st: Any, to_grid: Any) -> torch.Tensor | None:
        if st.wlayers:
            from inspect_model.methods.attention.hierarchical import fold

            missing = [w.name for w in st.wlayers if w.index not in st.abar]
            if missing:
                raise ModelRuntimeError(f"grad-rollout: no gradient reached the attention of '{missing[0]}'")
            blocks = {w.index: st.abar[w.index].reshape(st.batch, w.groups, w.n, w.n) for w in st.wlayers}
            return fold(st.wlayers, blocks, st.batch, residual=True)
        if st.gr_row is None:
            raise ModelRuntimeError("grad-rollout: no gradient reached the attention layers")
        return to_grid(st.gr_row)
