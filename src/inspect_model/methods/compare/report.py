"""The ``compare`` report: typed records (its JSON schema is generated from them) and the
step from per-layer sums to the report: status per layer, the first layer past the tolerance,
the error's growth along depth, the first layer with NaN/Inf on each side, overflow and
underflow of a reduced-precision side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from inspect_model.methods.compare.stats import PairSums

#: A layer's status: equal (every element the same), within (relative error <= tolerance),
#: past (over it), nonfinite (NaN/Inf on side B, not on A), shape (outputs of other shapes),
#: missing (B gave no output for it).
STATUSES = ("equal", "within", "past", "nonfinite", "shape", "missing")


@dataclass(frozen=True)
class LayerDiff:
    """One matched layer's pair of outputs, over every call and batch."""

    name: str  # A's layer
    other: str  # B's layer
    type: str
    matched_by: str  # map, name or order
    order: int  # place in A's forward (first call)
    calls: int
    shape: tuple[int, ...] | None
    status: str
    relative_error: float | None  # ‖a−b‖ / ‖a‖
    max_abs_error: float | None
    cosine: float | None
    beyond_tolerance: float | None  # share of elements with |a−b| > tol + tol·|a|
    growth: float | None  # relative error / that of the layer before (both non-zero)
    overflow: int | None  # values of A beyond B's dtype's largest (reduced precision only)
    underflow: int | None  # non-zero values of A below B's dtype's smallest normal
    nonfinite_a: int
    nonfinite_b: int


@dataclass(frozen=True)
class OutputDiff:
    """One output tensor of the model (``""`` for a lone tensor, ``logits``, ``0/boxes``)."""

    key: str
    shape: tuple[int, ...]
    other_shape: tuple[int, ...]
    relative_error: float | None
    max_abs_change: float | None  # the largest logit change for a classifier
    cosine: float | None
    top1_agreement: float | None  # share of rows (or tokens) whose argmax agrees


@dataclass(frozen=True)
class TensorChange:
    name: str
    shape: tuple[int, ...]
    norm_diff: float | None
    relative_change: float | None
    max_abs: float | None
    note: str | None


@dataclass(frozen=True)
class WeightChange:
    """One layer's own parameters and buffers, A against B (``--weights-only``)."""

    name: str
    other: str
    type: str
    values: int
    norm: float  # ‖A's tensors‖
    norm_diff: float
    relative_change: float | None
    max_abs: float
    tensors: tuple[TensorChange, ...]


@dataclass(frozen=True)
class MemoryUse:
    """What the run held of B's layer outputs at once: "ahead" (B runs ahead of A within
    ``budget_bytes``), "cached" (all of a compiled or traced B's outputs at once) or "none"."""

    mode: str  # ahead | cached | none
    peak_outputs: int
    peak_bytes: int
    budget_bytes: int | None = None


@dataclass(frozen=True)
class CompareReport:
    """The ``compare`` report body."""

    model: str
    other: str
    against: str  # what B is: model, checkpoint, dtype:float16, device:cuda, compiled, export, ...
    mode: str  # activations | weights
    tolerance: float
    fail_above: float | None
    matched: int
    matched_by: dict[str, int]
    first_divergent: str | None  # the first layer past the tolerance (or with NaN/Inf on B only)
    first_failing: str | None  # the first layer past --fail-above
    growth: float | None  # relative error at the last compared layer / at the first divergent one
    nonfinite_origin_a: str | None
    nonfinite_origin_b: str | None
    overflow_layers: tuple[str, ...]
    underflow_layers: tuple[str, ...]
    layers: tuple[LayerDiff, ...]
    outputs: tuple[OutputDiff, ...]
    weights: tuple[WeightChange, ...]
    unmatched_a: tuple[str, ...]
    unmatched_b: tuple[str, ...]
    memory: MemoryUse

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def status_of(s: PairSums, tolerance: float) -> str:
    if s.other_shape is not None:
        return "shape"
    if not s.compared:
        return "missing"
    if s.nonfinite_b > s.nonfinite_a:
        return "nonfinite"
    rel = s.relative_error()
    if rel == 0.0:
        return "equal"
    return "within" if rel is not None and rel <= tolerance else "past"


def layer_rows(sums: dict[str, PairSums], order: dict[str, int], pairs: dict[str, str], how: dict[str, str],
               types: dict[str, str], *, tolerance: float, low: bool) -> list[LayerDiff]:
    """The per-layer rows in A's forward order, growth along depth filled in."""
    rows = []
    prev: float | None = None
    for name in sorted(sums, key=lambda n: order.get(n, len(order))):
        s = sums[name]
        rel = s.relative_error()
        growth = rel / prev if rel and prev else None
        if rel is not None and s.compared:
            prev = rel if rel > 0 else prev
        rows.append(LayerDiff(
            name, pairs.get(name, name), types.get(name, ""), how.get(name, "name"), order.get(name, -1), s.calls,
            s.shape, status_of(s, tolerance), rel, s.max_abs if s.compared else None, s.cosine(), s.beyond_share(),
            growth, s.overflow if low else None, s.underflow if low else None, s.nonfinite_a, s.nonfinite_b))
    return rows


def divergence(rows: list[LayerDiff], fail_above: float | None) -> dict[str, Any]:
    """The first divergent and first failing layers, growth from there to the last layer,
    where NaN/Inf first appear on each side, the layers with overflow/underflow."""
    first = next((r for r in rows if r.status in ("past", "nonfinite")), None)
    failing = None
    if fail_above is not None:
        failing = next((r for r in rows if r.status == "nonfinite" or r.status == "shape"
                        or (r.relative_error is not None and r.relative_error > fail_above)), None)
    compared = [r for r in rows if r.relative_error is not None]
    growth = None
    if first is not None and first.relative_error and compared and compared[-1].relative_error is not None:
        growth = compared[-1].relative_error / first.relative_error
    return {
        "first_divergent": first.name if first else None,
        "first_failing": failing.name if failing else None,
        "growth": growth,
        "nonfinite_origin_a": next((r.name for r in rows if r.nonfinite_a), None),
        "nonfinite_origin_b": next((r.name for r in rows if r.nonfinite_b), None),
        "overflow_layers": tuple(r.name for r in rows if r.overflow),
        "underflow_layers": tuple(r.name for r in rows if r.underflow),
    }


def output_rows(out_a: Any, out_b: Any, acc: dict[str, dict[str, Any]]) -> None:
    """Add one batch's model outputs to ``acc`` (key -> sums and top-1 counts)."""
    import torch

    from inspect_model.engine.records import flatten_tensors
    from inspect_model.methods.compare.stats import top1_agreement

    fb = dict(flatten_tensors(out_b))
    for key, a in flatten_tensors(out_a):
        b = fb.get(key)
        if not isinstance(a, torch.Tensor) or not a.is_floating_point() or b is None:
            continue
        entry = acc.setdefault(key, {"sums": PairSums(), "agree": 0.0, "rows": 0, "other": tuple(b.shape)})
        entry["sums"].add(a, b, 0.0)
        agree = top1_agreement(a, b)
        if agree is not None:
            n = int(a[..., 0].numel())
            entry["agree"] += agree * n
            entry["rows"] += n


def outputs_of(acc: dict[str, dict[str, Any]]) -> list[OutputDiff]:
    out = []
    for key, e in acc.items():
        s: PairSums = e["sums"]
        out.append(OutputDiff(key, s.shape or (), e["other"], s.relative_error(), s.max_abs if s.compared else None,
                              s.cosine(), e["agree"] / e["rows"] if e["rows"] else None))
    return out
