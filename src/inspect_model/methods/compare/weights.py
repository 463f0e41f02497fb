"""``--weights-only``: what a fine-tune, a merge or a cast did to the parameters and buffers.

Per matched layer (every module with parameters or buffers of its own), each tensor of A
against B's tensor of the same local name: ``‖a−b‖``, ``‖a−b‖/‖a‖`` and ``max |a−b|``, and the
layer's totals over its tensors. No input, no forward pass. Sums in float64.
"""

from __future__ import annotations

import math
from typing import Any

from inspect_model.methods.compare.report import TensorChange, WeightChange


def own_tensors(module: Any) -> dict[str, Any]:
    out = dict(module.named_parameters(recurse=False))
    out.update(dict(module.named_buffers(recurse=False)))
    return out


def weight_layers(model: Any) -> list[str]:
    """Every module with tensors of its own, in module order."""
    return [n for n, m in model.named_modules() if own_tensors(m)]


def compare_weights(a_model: Any, b_model: Any, pairs: dict[str, str]) -> list[WeightChange]:
    import torch

    a_mods, b_mods = dict(a_model.named_modules()), dict(b_model.named_modules())
    rows = []
    for a_name, b_name in pairs.items():
        ta, tb = own_tensors(a_mods[a_name]), own_tensors(b_mods[b_name])
        tensors, sq_d, sq_a, max_abs, count = [], 0.0, 0.0, 0.0, 0
        for local, a in ta.items():
            b = tb.get(local)
            if b is None or tuple(a.shape) != tuple(b.shape) or not a.is_floating_point() and a.dtype != b.dtype:
                tensors.append(TensorChange(local, tuple(a.shape), None, None, None,
                                            "missing in B" if b is None else "shape or dtype differs in B"))
                continue
            x = a.detach().to(torch.float64).reshape(-1)
            y = b.detach().to(device=x.device, dtype=torch.float64).reshape(-1)
            d = x - y
            nd, na = float(torch.dot(d, d)), float(torch.dot(x, x))
            mx = float(d.abs().max()) if d.numel() else 0.0
            sq_d, sq_a, max_abs, count = sq_d + nd, sq_a + na, max(max_abs, mx), count + int(x.numel())
            tensors.append(TensorChange(local, tuple(a.shape), math.sqrt(nd), _ratio(nd, na), mx, None))
        rows.append(WeightChange(a_name, b_name, type(a_mods[a_name]).__name__, count, math.sqrt(sq_a),
                                 math.sqrt(sq_d), _ratio(sq_d, sq_a), max_abs, tuple(tensors)))
    return rows


def _ratio(sq_d: float, sq_a: float) -> float | None:
    if sq_d == 0.0:
        return 0.0
    return math.sqrt(sq_d) / math.sqrt(sq_a) if sq_a > 0 else None
