"""The attention ops' arithmetic, below :mod:`inspect_model.engine.attention`: probabilities
recomputed from Q, K, the mask and the scale as ``F.scaled_dot_product_attention`` defines
them, the dispatch-level watch inside ``nn.MultiheadAttention`` (its fused kernel's Q, K, V, or
the softmax it computes), and reshaping helpers. Imports only torch.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["KernelWatch", "kernel_watch", "as_float", "as_heads", "mask4", "native_probs", "recompute"]


def recompute(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
              scale: float | None) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) as ``F.scaled_dot_product_attention`` defines it.

    ``q`` (B, h, L, E), ``k`` (B, hk, S, E) with hk dividing h (grouped-query attention);
    computed in float32 (float64 kept). Returns (B, h, L, S)."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k = q.detach().to(dtype), k.detach().to(dtype)
    if k.shape[-3] != q.shape[-3] and q.dim() >= 3:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = torch.matmul(q, k.transpose(-2, -1)).mul_(s)
    L, S = logits.shape[-2], logits.shape[-1]
    if is_causal:
        causal = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        logits.masked_fill_(~causal, float("-inf"))
    if mask is not None:
        mask = mask.detach()
        if mask.dtype == torch.bool:
            logits.masked_fill_(~mask, float("-inf"))
        else:
            logits.add_(mask.to(dtype))
    # A fully masked row gives NaN in softmax; SDPA's kernels give zeros: match them.
    return torch.softmax(logits, dim=-1).nan_to_num_(0.0)


def as_heads(t: torch.Tensor, batch: int) -> torch.Tensor:
    """(B*h, L, S) or (B, h, L, S) or (L, S) -> (B, h, L, S)."""
    if t.dim() == 4:
        return t
    if t.dim() == 3:
        return t.reshape(batch, t.shape[0] // batch, *t.shape[1:])
    return t.reshape(1, 1, *t.shape[-2:])


class KernelWatch(TorchDispatchMode):
    """Inside an ``nn.MultiheadAttention``: the first attention kernel's Q, K, V, mask and
    scale, or the first last-dimension softmax and the value it multiplies.

    The native fast-path kernel on the CPU is asked for its per-head weights when the layer is
    wanted (``grab``): it computes them anyway, and its output is bit for bit the same (checked
    in the tests); elsewhere Q and K are recomputed from its inputs."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # False: torch would wrap __torch_dispatch__ in torch._disable_dynamo, which imports
        # torch._dynamo (about a second) on the first op. Only safe while nothing is compiled:
        # kernel_watch() picks GuardedKernelWatch once Dynamo is loaded.
        return False

    def __init__(self, grab: bool = False) -> None:
        super().__init__()
        self.grab = grab
        self.qkv: dict[str, Any] | None = None
        self.softmax: torch.Tensor | None = None
        self.value: torch.Tensor | None = None
        self.weights: torch.Tensor | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.__name__
        if self.qkv is None and self.softmax is None and name.startswith("_native_multi_head_attention"):
            return self._native(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.qkv is None and self.softmax is None and name.startswith("_scaled_dot_product"):
            bound = bind(func, args, kwargs)
            self.qkv = {"q": bound["query"], "k": bound["key"], "v": bound["value"],
                        "mask": bound.get("attn_mask", bound.get("attn_bias")),
                        "is_causal": bool(bound.get("is_causal", False)), "scale": bound.get("scale")}
        elif self.qkv is None and self.softmax is None and name.split(".")[0] in ("_softmax", "_safe_softmax"):
            dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
            if dim in (-1, args[0].dim() - 1):
                self.softmax = out
        elif (self.softmax is not None and self.value is None and name.split(".")[0] in ("bmm", "mm")
              and args[0].data_ptr() == self.softmax.data_ptr()):
            self.value = args[1]
        return out

    def _native(self, func: Any, args: Any, kwargs: Any) -> Any:
        bound = bind(func, args, kwargs)
        self.qkv = {"native": bound}
        if not self.grab or bound["query"].device.type != "cpu" or bound.get("need_weights"):
            return func(*args, **kwargs)
        asked = dict(bound, need_weights=True, average_attn_weights=False)
        out, weights = func(*[asked[a.name] for a in func._schema.arguments])
        self.weights = weights
        return out, None  # what the kernel returns for need_weights=False


class GuardedKernelWatch(KernelWatch):
    """The watch as torch defines modes by default: Dynamo does not trace into it."""

    __torch_dispatch__ = torch._disable_dynamo(KernelWatch.__torch_dispatch__, recursive=True)


def kernel_watch(grab: bool) -> KernelWatch:
    """A watch; Dynamo-guarded when Dynamo is loaded (a compiled model may run under it)."""
    return (GuardedKernelWatch if "torch._dynamo" in sys.modules else KernelWatch)(grab=grab)


def bind(func: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    bound = {a.name: v for a, v in zip(func._schema.arguments, args, strict=False)}
    for a in func._schema.arguments[len(args):]:
        if a.name not in kwargs and a.has_default_value():
            bound[a.name] = a.default_value
    bound.update(kwargs)
    return bound


def as_float(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def native_probs(bound: dict[str, Any], heads: int) -> torch.Tensor:
    """Probabilities of a ``_native_multi_head_attention`` call (the fast path, inference
    only): Q and K recomputed from its inputs and packed in-projection. (B, h, L, S)."""
    w, b = bound["qkv_weight"].detach(), bound["qkv_bias"]
    e = int(bound["embed_dim"])
    q = F.linear(bound["query"].detach(), w[:e], None if b is None else b[:e].detach())
    k = F.linear(bound["key"].detach(), w[e:2 * e], None if b is None else b[e:2 * e].detach())
    q = q.reshape(*q.shape[:-1], heads, e // heads).transpose(-3, -2)
    k = k.reshape(*k.shape[:-1], heads, e // heads).transpose(-3, -2)
    mask = bound.get("mask")
    if isinstance(mask, torch.Tensor):
        if mask.dtype == torch.bool:  # MHA's convention: True = not attended
            mask = ~mask
        if int(bound.get("mask_type") or 0) == 1 and mask.dim() == 2:  # key padding (B, S)
            mask = mask[:, None, None, :]
    return recompute(q, k, mask, False, None)


def mask4(mask: Any, batch: int, heads: int) -> Any:
    """An MHA kernel mask (B*h or B, ..., S) reshaped to broadcast against (B, h, L, S)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 3:
        return mask
    if mask.dim() == 3 and mask.shape[0] == batch * heads:
        return mask.reshape(batch, heads, *mask.shape[1:])
    return mask
