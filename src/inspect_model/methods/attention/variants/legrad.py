"""LeGrad (Bousselham et al. 2024, as torch-cam 0.5's ``LeGrad``): for each chosen block l,
the class score s^l of that block's tokens through the model's head, ∂s^l/∂A^l, its positive
part averaged over heads and queries; maps averaged over layers. The per-layer gradients come
from one backward pass of its own: the gradient arriving at each block's output is replaced
by ∂s^l/∂x^l, so what reaches A^l is ∂s^l/∂A^l exactly. Windowed models (Swin, MaxViT) take
it on their last stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelRuntimeError, UnsupportedModelError
from inspect_model.methods.attention.base import AttentionMethod, register

if TYPE_CHECKING:
    import torch
    from torch import nn


def head_backward(score: Any, tokens: list[torch.Tensor], idx: torch.Tensor, leaf: torch.Tensor) -> None:
    """The one backward pass from ``tokens[-1]`` to ``leaf`` in which the gradient arriving at
    each block's output ``tokens[l]`` is ∂s^l/∂x^l, ``s^l = score(x^l)`` (B, classes) at the
    targets ``idx`` (B, 1): what reaches each attention layer is ∂s^l/∂A^l (vision and text)."""
    import torch

    grads = []
    for t in tokens:
        x = t.detach().requires_grad_(True)
        s = score(x)
        grads.append(torch.autograd.grad(s.gather(1, idx.to(s.device)).sum(), x)[0])
    handles = [t.register_hook(lambda _g, gl=gl: gl) for t, gl in zip(tokens[:-1], grads[:-1], strict=True)]
    try:
        torch.autograd.grad(tokens[-1], leaf, grad_outputs=grads[-1])
    finally:
        for h in handles:
            h.remove()


@register
class LeGrad(AttentionMethod):
    name, title, paper, order = "legrad", "LeGrad", "Bousselham et al. 2024", 40
    text = True
    needs_gradients = True
    per_layer = True
    needs_head = True

    def backward(self, st: Any, call: Any, grad: torch.Tensor) -> None:
        if call.name not in st.head_layers:
            return
        rel = grad.clamp(min=0).mean(dim=(1, 2))  # (B, Nk), windowed (B * G, N)
        if call.name in st.windowed:  # put back on the stage's feature map, (B, H * W)
            from inspect_model.methods.attention.windows import unpartition

            owner = st.owners[call.name]
            rel, st.legrad_hw = unpartition(rel[:, None], st.batch, owner).flatten(1), owner.hw
        st.legrad = rel if st.legrad is None else st.legrad + rel
        st.legrad_count += 1

    def text_backward(self, st: Any, call: Any, grad: torch.Tensor) -> None:
        if call.name not in st.head_layers:
            return
        lengths = grad.new_tensor(st.lengths).view(-1, 1)
        rel = grad.clamp(min=0).mean(dim=1).sum(dim=1) / lengths  # over heads, then the text's real queries
        st.legrad = rel if st.legrad is None else st.legrad + rel
        st.legrad_count += 1

    def text_own_backward(self, model: nn.Module, st: Any, idx: torch.Tensor, leaf: torch.Tensor,
                          tokens: list[torch.Tensor], last: torch.Tensor) -> None:
        from inspect_model.methods.attention.text import text_projection

        project = text_projection(model, last)
        if project is None:
            raise UnsupportedModelError(f"legrad needs the model's head to score intermediate tokens, and "
                                        f"{type(model).__name__} is not a family it knows (BERT-style classifiers, "
                                        "causal language models); -m rollout,grad-rollout work")
        head_backward(project, tokens, idx, leaf)

    def text_result(self, st: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if st.legrad is None:
            raise ModelRuntimeError("legrad: no gradient reached the chosen attention layers")
        return (st.legrad / st.legrad_count).float().cpu(), None

    def own_backward(self, model: nn.Module, st: Any, idx: torch.Tensor, xin: torch.Tensor,
                     tokens: list[torch.Tensor]) -> None:
        """One backward pass that brings ∂s^l/∂A^l to every chosen layer l (module docstring):
        the gradient at each block's output is replaced by ∂s^l/∂x^l."""
        from inspect_model.methods.attention.models import model_scores, score_projection

        project = score_projection(model)
        if project is None:
            raise UnsupportedModelError(
                f"legrad needs the model's head to score intermediate tokens, and {type(model).__name__} is not a "
                "family it knows (torchvision ViT, timm ViT/DeiT/EVA, HF ViT/DeiT/CLIP classification); "
                "-m rollout,grad-rollout work")
        head_backward(lambda t: model_scores(project(t)), tokens, idx, xin)

    def result(self, st: Any, to_grid: Any) -> torch.Tensor | None:
        if st.legrad is None:
            raise ModelRuntimeError("legrad: no gradient reached the chosen attention layers")
        mean = st.legrad / st.legrad_count
        return mean.reshape(st.batch, *st.legrad_hw).float().cpu() if st.legrad_hw else to_grid(mean)
