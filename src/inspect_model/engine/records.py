"""What the hook engine records: one :class:`CallRecord` per call of a hooked module, whose
inputs and outputs are flattened (``flatten_tensors``) into :class:`TensorCapture` items keyed
``""`` for a lone tensor, ``"0"``, ``"logits"``, ``"aux/1"`` for nested ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def flatten_tensors(obj: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Flatten nested outputs to ``(key, tensor)`` pairs: tuples/lists by index, dicts and
    dataclass-like model outputs by field name, joined with '/'."""
    import torch

    out: list[tuple[str, torch.Tensor]] = []

    def join(key: object) -> str:
        return f"{prefix}/{key}" if prefix else str(key)

    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(flatten_tensors(v, join(k)))
    elif isinstance(obj, (list, tuple)):
        if hasattr(obj, "_fields"):  # namedtuple: use field names
            for k, v in zip(obj._fields, obj):  # type: ignore[attr-defined]
                out.extend(flatten_tensors(v, join(k)))
        else:
            for i, v in enumerate(obj):
                out.extend(flatten_tensors(v, join(i)))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out.extend(flatten_tensors(getattr(obj, f.name), join(f.name)))
    return out


@dataclass
class TensorCapture:
    """One tensor seen at a hooked call: its place in the nested value and what was taken."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    requires_grad: bool
    stats: Any = None  # result of CaptureOptions.stats_fn
    tensor: torch.Tensor | None = None  # detached clone, when kept
    grad_stats: Any = None  # stats of d(target)/d(this tensor)
    grad: torch.Tensor | None = None  # the gradient itself, when kept
    grad_calls: int = 0  # how many times autograd delivered a gradient here


@dataclass
class CallRecord:
    """One call of one hooked module during a forward pass."""

    name: str  # qualified module name ("" is the root model)
    module_type: str
    call_index: int  # 0 for the first call of this module in the pass, 1 for the second...
    order: int  # position among all recorded calls, in the order calls started
    depth: int
    inputs: list[TensorCapture] = field(default_factory=list)
    outputs: list[TensorCapture] = field(default_factory=list)
    finished: bool = False  # False when the module raised (or a child did) during this call
    calls_total: int = 1  # how many times the module was called in this pass

    @property
    def key(self) -> str:
        """``name`` for a module called once, ``name#i`` for the i-th call of a reused one."""
        base = self.name or "(model)"
        return base if self.calls_total == 1 else f"{base}#{self.call_index}"
