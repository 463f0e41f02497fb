"""Attention capture: the probabilities of every attention layer, whatever kernel computes them.

Fused kernels (``F.scaled_dot_product_attention`` on its flash, memory-efficient, cuDNN or
math backend; ``nn.MultiheadAttention`` with ``need_weights=False``) never materialise the
(queries x keys) probabilities, so no module hook can see them (vit-explain #23). This module
watches the attention *op* instead, with a ``TorchFunctionMode``:

- ``F.scaled_dot_product_attention``: Q, K, the mask and the scale are read from the call and
  the probabilities recomputed as softmax(Q K^T * scale + mask) (dropout ignored, as in eval);
- ``nn.MultiheadAttention``: the module runs as called, with the torch-function mode switched
  off (so that it keeps its fused fast path in inference), under a ``TorchDispatchMode`` that
  reads Q, K, V off the attention kernel it reaches, or the softmax it computes when
  ``need_weights=True`` or on the math path; on the fast path (one native kernel), Q and K are
  recomputed from the kernel's input and in-projection;
- an eager ``softmax`` over the last dimension inside an attention module (HF "eager", older
  timm, torchvision's Swin and MaxViT): its output is the probabilities.

The op itself always runs with the caller's arguments, so the model's outputs are bit for bit
those of a run without capture. Each call is attributed to the innermost running module that
looks like an attention module (:func:`attention_modules`), else the innermost module.

Probabilities are computed only for the layers asked for and handed to a callback, then
dropped; nothing is kept here. With ``backward`` given, the gradient of the explained score
with respect to the probabilities, dS/dA, is handed over during the backward pass: for a fused
op it is dS/dO V^T (O = A V, so this is exact), read off a tensor hook on the op's output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from inspect_model.engine.attention_ops import (
    KernelWatch,
    as_float,
    as_heads,
    kernel_watch,
    mask4,
    native_probs,
    recompute,
)
from inspect_model.errors import ModelRuntimeError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["AttentionCall", "AttentionCapture", "attention_modules", "prefix_tokens"]

_SOFTMAX = {torch.softmax, torch.Tensor.softmax, F.softmax, torch.nn.functional.softmax}
_SDPA = F.scaled_dot_product_attention


@dataclass
class AttentionCall:
    """One attention op run by one module: who called it and the shapes it saw.

    ``probs()`` gives the (B, heads, queries, keys) probabilities (recomputed lazily, float32
    or float64), ``None`` for a layer not asked for."""

    name: str  # qualified name of the calling module
    index: int  # call order within the forward pass (0 = first attention op)
    kind: str  # "sdpa", "mha" or "softmax"
    batch: int
    heads: int
    queries: int
    keys: int
    module: Any = field(default=None, repr=False)  # the calling nn.Module
    _probs: Callable[[], torch.Tensor] | None = field(default=None, repr=False)

    def probs(self) -> torch.Tensor:
        if self._probs is None:
            raise ModelRuntimeError(f"attention of '{self.name}' was not captured")
        return self._probs()


ForwardFn = Callable[[AttentionCall], None]
BackwardFn = Callable[[AttentionCall, torch.Tensor], None]  # (call, dS/dA of shape (B, h, Nq, Nk))


def attention_modules(model: nn.Module) -> list[str]:
    """Qualified names of the modules that compute attention, innermost first-come order.

    An attention module is an ``nn.MultiheadAttention`` or one whose class name contains
    "Attention" (timm ``Attention``/``WindowAttention``/``EvaAttention``, HF
    ``ViTSelfAttention``/``CLIPAttention``, torchvision ``ShiftedWindowAttention``), without a
    descendant that is one too (HF ``ViTAttention`` holds ``ViTSelfAttention``)."""
    from torch import nn as tnn

    def is_attn(m: Any) -> bool:
        return isinstance(m, tnn.MultiheadAttention) or "attention" in type(m).__name__.lower()

    names = [n for n, m in model.named_modules() if n and is_attn(m)]
    inner = []
    for n in names:
        if not any(o != n and o.startswith(n + ".") for o in names):
            inner.append(n)
    return inner


def prefix_tokens(model: nn.Module, tokens: int | None = None) -> int:
    """How many non-patch tokens (class, distillation, register tokens) lead the sequence.

    Read from the model where it says (timm ``num_prefix_tokens``, torchvision's
    ``class_token``, HF embeddings' ``cls_token``/``distillation_token``), else inferred from
    ``tokens``: what is left over above the largest square."""
    n = getattr(model, "num_prefix_tokens", None)
    if isinstance(n, int):
        return n
    if getattr(model, "class_token", None) is not None and hasattr(model, "conv_proj"):
        return 1  # torchvision VisionTransformer
    for _, m in model.named_modules():
        if type(m).__name__.endswith("Embeddings"):
            count = int(getattr(m, "cls_token", None) is not None)
            count += int(getattr(m, "distillation_token", None) is not None)
            count += int(getattr(m, "class_embedding", None) is not None)  # CLIP
            if count:
                return count
    if tokens is None:
        return 0
    side = math.isqrt(tokens)
    return tokens - side * side if tokens - side * side <= 8 else 0


class AttentionCapture:
    """Context manager: while active, every attention op of ``model`` is seen (module docstring).

    ``wanted(name)`` says which calling modules' probabilities to compute (all when ``None``);
    ``forward(call)`` gets each call of a wanted layer (``call.probs()`` valid during the
    callback); ``backward(call, grad)`` gets dS/dA during a later backward pass. ``calls``
    lists every attention call seen (wanted or not), in order, without tensors."""

    def __init__(self, model: nn.Module, *, wanted: Callable[[str], bool] | None = None,
                 forward: ForwardFn | None = None, backward: BackwardFn | None = None) -> None:
        self.model = model
        self.wanted = wanted
        self.forward_fn = forward
        self.backward_fn = backward
        self.candidates = set(attention_modules(model))
        self.calls: list[AttentionCall] = []
        self._stack: list[tuple[str, Any]] = []
        self._handles: list[Any] = []
        self._mode: _Mode | None = None
        self._mha_open: list[tuple[KernelWatch, Any]] = []

    # -- borrowing the model ---------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            from torch import nn as tnn

            for name, module in self.model.named_modules():
                self._handles.append(module.register_forward_pre_hook(self._push(name, module)))
                self._handles.append(module.register_forward_hook(self._pop, always_call=True))
                if isinstance(module, tnn.MultiheadAttention):
                    self._handles.append(module.register_forward_pre_hook(self._mha_enter, with_kwargs=True))
                    self._handles.append(module.register_forward_hook(
                        self._mha_exit(name), with_kwargs=True, always_call=True))
            self._mode = _Mode(self)
            self._mode.__enter__()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._mode is not None:
                mode, self._mode = self._mode, None
                mode.__exit__(exc_type, exc, tb)
        finally:
            self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()
        while self._mha_open:  # a forward pass that raised inside an nn.MultiheadAttention
            watch, disabled = self._mha_open.pop()
            watch.__exit__(None, None, None)
            disabled.__exit__(None, None, None)

    def _push(self, name: str, module: Any) -> Callable[..., None]:
        def hook(_m: Any, _args: Any) -> None:
            self._stack.append((name, module))
        return hook

    def _pop(self, _m: Any, _args: Any, _out: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _mha_enter(self, _m: Any, _args: Any, _kwargs: Any) -> None:
        # has_torch_function() is False again inside, so the module picks the path it would
        # pick without capture (the native fast path in inference): outputs bit-identical.
        disabled = torch._C.DisableTorchFunction()
        disabled.__enter__()
        name = self._stack[-1][0] if self._stack else ""
        watch = kernel_watch(self.wanted is None or self.wanted(name))
        watch.__enter__()
        self._mha_open.append((watch, disabled))

    def _mha_exit(self, name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any, out: Any) -> None:
            if not self._mha_open:
                return
            watch, disabled = self._mha_open.pop()
            watch.__exit__(None, None, None)
            disabled.__exit__(None, None, None)
            if out is not None:
                self.on_mha((name, module), args, kwargs, watch, out)
        return hook

    def reset(self) -> None:
        """Forget the calls of the previous forward pass."""
        self.calls.clear()

    # -- attribution -----------------------------------------------------------------------
    def _caller(self) -> tuple[str, Any] | None:
        for name, module in reversed(self._stack):
            if name in self.candidates:
                return name, module
        if self.candidates:
            return None  # an op outside every attention module (a head's softmax, ...)
        return self._stack[-1] if self._stack else None

    def _record(self, kind: str, caller: tuple[str, Any], shape: tuple[int, int, int, int],
                probs: Callable[[], torch.Tensor]) -> AttentionCall | None:
        b, h, nq, nk = shape
        call = AttentionCall(caller[0], len(self.calls), kind, b, h, nq, nk, caller[1])
        self.calls.append(call)
        if self.wanted is not None and not self.wanted(call.name):
            return None
        live = replace(call, _probs=_once(probs))
        if self.forward_fn is not None:
            self.forward_fn(live)
        # Nothing is kept past the callback: a backward hook recomputes what it needs.
        live._probs = _once(probs)
        return live

    def _want_grad(self, t: Any) -> bool:
        return self.backward_fn is not None and isinstance(t, torch.Tensor) and t.requires_grad

    # -- the three ops ---------------------------------------------------------------------
    def on_sdpa(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor) -> None:
        caller = self._caller()
        if caller is None:
            return
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        mask, causal, scale = bound.get("attn_mask"), bool(bound.get("is_causal", False)), bound.get("scale")
        q4 = q if q.dim() == 4 else q.reshape(-1, *q.shape[-3:]) if q.dim() > 4 else q.unsqueeze(0)
        shape = (q4.shape[0], q4.shape[1], q.shape[-2], k.shape[-2])
        call = self._record("sdpa", caller, shape,
                            lambda: as_heads(recompute(q, k, mask, causal, scale), shape[0]))
        if call is not None and self._want_grad(out):
            def grad_hook(g: torch.Tensor, call: AttentionCall = call) -> None:
                vv = v.detach()
                if vv.shape[-3] != g.shape[-3]:
                    vv = vv.repeat_interleave(g.shape[-3] // vv.shape[-3], dim=-3)
                dtype = _float_of(vv)  # not call.probs(): LeGrad needs dS/dA alone, no recomputed A
                ga = torch.matmul(g.detach().to(dtype), vv.to(dtype).transpose(-2, -1))
                self._backward(call, as_heads(ga, shape[0]))
            out.register_hook(grad_hook)

    def on_softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if not isinstance(out, torch.Tensor) or out.dim() < 3 or not self.candidates:
            return
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dim not in (-1, out.dim() - 1):
            return
        caller = self._caller()
        if caller is None:
            return
        p = out.detach()
        batch = p.shape[0] if p.dim() == 4 else 1
        p4 = as_heads(p, batch) if p.dim() <= 4 else p.reshape(-1, *p.shape[-3:])
        call = self._record("softmax", caller, tuple(p4.shape), lambda: as_float(p4))  # type: ignore[arg-type]
        if call is not None and self._want_grad(out):
            out.register_hook(lambda g, call=call: self._backward(call, as_float(g.reshape(p4.shape))))

    def on_mha(self, caller: tuple[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               watch: KernelWatch, out: Any) -> None:
        module = caller[1]
        attn_out = out[0] if isinstance(out, tuple) else out
        query = args[0] if args else kwargs["query"]
        first = bool(module.batch_first)
        batch = (query.shape[0] if first else query.shape[1]) if query.dim() == 3 else 1
        heads = int(module.num_heads)
        v: torch.Tensor | None = None
        if watch.weights is not None:
            weights = watch.weights
            shape = tuple(weights.shape)  # type: ignore[assignment]
            get = lambda: as_float(weights)
        elif watch.qkv is not None and "native" in watch.qkv:
            native = watch.qkv["native"]
            lq, lk = native["query"].shape[-2], native["key"].shape[-2]
            shape = (batch, heads, lq, lk)
            get = lambda: native_probs(native, heads)
        elif watch.qkv is not None:
            info = watch.qkv
            q, k, v = info["q"], info["k"], info["v"]
            shape = (batch, heads, q.shape[-2], k.shape[-2])
            get = lambda: as_heads(recompute(
                q.reshape(batch, heads, *q.shape[-2:]), k.reshape(batch, heads, *k.shape[-2:]),
                mask4(info["mask"], batch, heads), info["is_causal"], info["scale"]), batch)
        elif watch.softmax is not None:
            p = as_heads(watch.softmax, batch)
            v = watch.value
            shape = tuple(p.shape)  # type: ignore[assignment]
            get = lambda: as_float(p)
        else:
            raise ModelRuntimeError(f"attention op of '{caller[0]}' not recognised (no attention kernel ran)")
        call = self._record("mha", caller, shape, get)
        if call is None or not self._want_grad(attn_out) or v is None:
            return
        w_out = module.out_proj.weight.detach()

        def grad_hook(g: torch.Tensor, call: AttentionCall = call) -> None:
            # dS/d(head outputs) = dS/d(out_proj output) W_out, then (B, h, L, dh)
            gh = torch.matmul(g.detach(), w_out.to(g.dtype))
            gh = gh.reshape(*gh.shape[:-1], heads, -1)
            gh = gh.permute(0, 2, 1, 3) if first or gh.dim() == 3 else gh.permute(1, 2, 0, 3)
            gh = gh.reshape(batch, heads, *gh.shape[-2:])
            vv = v.detach().reshape(batch, heads, *v.shape[-2:])
            dtype = _float_of(vv)
            self._backward(call, torch.matmul(gh.to(dtype), vv.to(dtype).transpose(-2, -1)))
        attn_out.register_hook(grad_hook)

    def _backward(self, call: AttentionCall, grad: torch.Tensor) -> None:
        assert self.backward_fn is not None
        self.backward_fn(call, grad)


def _float_of(t: torch.Tensor) -> torch.dtype:
    """The dtype probabilities are recomputed in (``attention_ops.recompute``)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _once(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    cache: list[torch.Tensor] = []

    def get() -> torch.Tensor:
        if not cache:
            with torch.no_grad():
                cache.append(fn())
        return cache[0]
    return get


class _Mode(TorchFunctionMode):
    """The torch-function mode behind :class:`AttentionCapture`: runs every op as called and
    reports the attention ones."""

    def __init__(self, capture: AttentionCapture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA:
            out = func(*args, **kwargs)
            self.capture.on_sdpa(args, kwargs, out)
            return out
        if func in _SOFTMAX:
            out = func(*args, **kwargs)
            self.capture.on_softmax(args, kwargs, out)
            return out
        return func(*args, **kwargs)
