"""Statistics per token position for ``activations --text`` and ``grads --text`` (issue 26).

For each chosen layer whose output is (B, L, D) over the batch's tokens, and for each
position p, the values of the real tokens at p (padding left out, by the batch's attention
mask) are summed over every text of the run: their count, mean, standard deviation and the
mean L2 norm of a token's D-vector. ``grads`` adds the same of the gradient with respect to
that output (a tensor hook on it: module backward hooks misbehave with in-place ops,
pytorch#61519). Sums merge exactly (``--resume``, torchrun).

The layers: those named with ``--layers``, else the transformer blocks (the items of the
module list each attention layer sits in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class _Sums:
    """Per-position sums of one layer and kind ("output" or "gradient"), float64 on the CPU."""

    count: Any = None  # (L,) real tokens at each position
    total: Any = None  # (L,) sum of values
    squares: Any = None  # (L,) sum of squared values
    norms: Any = None  # (L,) sum of per-token L2 norms
    width: int = 0  # D

    def add(self, x: torch.Tensor, mask: torch.Tensor) -> None:
        import torch

        x = x.detach().to(torch.float64).flatten(2)  # (B, L, D)
        m = mask.to(device=x.device, dtype=torch.float64)  # (B, L)
        parts = [m.sum(0), (x.sum(-1) * m).sum(0), (x.square().sum(-1) * m).sum(0),
                 (x.norm(dim=-1) * m).sum(0)]
        self.width = int(x.shape[-1])
        for name, v in zip(("count", "total", "squares", "norms"), parts, strict=True):
            setattr(self, name, _grow_add(getattr(self, name), v.cpu()))

    def merge(self, other: _Sums) -> None:
        for name in ("count", "total", "squares", "norms"):
            if getattr(other, name) is not None:
                setattr(self, name, _grow_add(getattr(self, name), getattr(other, name)))
        self.width = self.width or other.width

    def report(self) -> dict[str, Any]:

        n = self.count * max(self.width, 1)
        safe = n.clamp_min(1)
        mean = self.total / safe
        var = (self.squares / safe - mean.square()).clamp_min(0)
        norm = self.norms / self.count.clamp_min(1)

        def out(v: torch.Tensor) -> list[float | None]:
            return [float(x) if c > 0 else None for x, c in zip(v.tolist(), self.count.tolist(), strict=True)]
        return {"tokens": [int(c) for c in self.count.tolist()], "mean": out(mean), "std": out(var.sqrt()),
                "norm": out(norm), "width": self.width}


def _grow_add(a: Any, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` over positions, the shorter one padded with zeros (texts differ in length)."""
    import torch.nn.functional as F

    if a is None:
        return b.clone()
    if a.shape[0] < b.shape[0]:
        a = F.pad(a, (0, b.shape[0] - a.shape[0]))
    elif b.shape[0] < a.shape[0]:
        b = F.pad(b, (0, a.shape[0] - b.shape[0]))
    return a + b


def default_layers(model: nn.Module) -> list[str]:
    """The transformer blocks: the module-list items the attention layers sit in."""
    from inspect_model.engine.attention import attention_modules
    from inspect_model.errors import InspectModelError
    from inspect_model.methods.attention.models import block_of

    out: list[str] = []
    for name in attention_modules(model):
        try:
            out.append(block_of(model, name))
        except InspectModelError:
            continue
    return list(dict.fromkeys(out))


@dataclass
class PositionStats:
    """While entered, the per-position sums of ``layers`` (module docstring); ``mask()``
    gives the attention mask of the batch being run (the text binding's)."""

    model: Any
    layers: list[str]
    mask: Any  # Callable[[], torch.Tensor | None]
    gradients: bool = False
    sums: dict[tuple[str, str], _Sums] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)

    def __enter__(self) -> Self:
        modules = dict(self.model.named_modules())
        try:
            for name in self.layers:
                self._handles.append(modules[name].register_forward_hook(self._hook(name)))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, name: str) -> Any:
        import torch

        def hook(_m: Any, _args: Any, out: Any) -> None:
            t = out[0] if isinstance(out, tuple | list) and out else out
            mask = self.mask()
            if not isinstance(t, torch.Tensor) or mask is None or t.dim() < 3 or tuple(t.shape[:2]) != tuple(
                    mask.shape) or not t.is_floating_point():
                return
            self.sums.setdefault((name, "output"), _Sums()).add(t, mask)
            if self.gradients and t.requires_grad:
                t.register_hook(lambda g, mask=mask: self.sums.setdefault((name, "gradient"), _Sums()).add(g, mask))
        return hook

    def report(self) -> dict[str, Any]:
        rows = [{"name": n, "kind": k, **s.report()} for (n, k), s in self.sums.items()]
        order = {n: i for i, n in enumerate(self.layers)}
        rows.sort(key=lambda r: (order.get(r["name"], 0), r["kind"]))
        return {"over": "the real (unpadded) tokens at each position, over every text", "layers": rows}

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums}

    def merge(self, states: list[dict[str, Any]]) -> None:
        merged: dict[tuple[str, str], _Sums] = {}
        for st in states:
            for key, s in st["sums"].items():
                merged.setdefault(key, _Sums()).merge(s)
        self.sums = merged


def position_stats(prep: Any, specs: list[str] | None, *, gradients: bool = False) -> PositionStats | None:
    """The per-position statistics of a text run (``prep.plan`` a text plan), else None."""
    binding = getattr(prep, "binding", None)
    if getattr(getattr(prep, "plan", None), "texts", None) is None or binding is None:
        return None
    model = prep.loaded.model
    if specs:
        from inspect_model.engine.selection import select_layers

        layers = select_layers(model, specs)
    else:
        layers = default_layers(model)
    return PositionStats(model, layers, lambda: binding.mask, gradients=gradients)
