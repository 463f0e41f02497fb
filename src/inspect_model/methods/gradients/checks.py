"""Gradient health checks for ``inspect-model grads``: the NaN, Inf, vanishing and exploding
checks (:class:`Check`, :func:`health_checks`, definitions in the docstring of
:mod:`inspect_model.methods.gradients.flow`), where the first non-finite gradient appeared in
backward order, the parsing of ``--fail-on``, and what ``clip_grad_norm_`` would do
(:class:`ClipReport`). Everything here works on the finished records, never on tensors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inspect_model.errors import UsageError

if TYPE_CHECKING:
    from inspect_model.methods.gradients.records import LayerGrad, ParamGrad

CHECKS = ("nan", "inf", "vanishing", "exploding")
DEFAULT_VANISHING = 1e-5
DEFAULT_EXPLODING = 1e4


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail", "skip"
    value: float | None
    threshold: float | None
    detail: str
    layers: list[str] = field(default_factory=list)
    fail_on: bool = False  # requested with --fail-on

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass
class ClipReport:
    """What ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` would do (2-norm)."""

    max_norm: float
    total_norm: float
    clip_coef: float  # max_norm / (total_norm + 1e-6), as torch computes it
    scale: float  # min(1, clip_coef): the factor every gradient would be multiplied by
    clipped: bool
    dominant: list[tuple[str, float]]  # (parameter, share of total squared norm), largest first


def parse_fail_on(text: str | Sequence[str] | None) -> list[str]:
    items = text.split(",") if isinstance(text, str) else list(text or [])
    out = []
    for raw in items:
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            out.extend(CHECKS)
        elif name in CHECKS:
            out.append(name)
        else:
            raise UsageError(f"--fail-on '{raw.strip()}' is not a check; choose from {','.join(CHECKS)} or all")
    return list(dict.fromkeys(out))


def clip_report(clip_norm: float, total: float, shares: list[tuple[str, float]]) -> ClipReport:
    """What ``clip_grad_norm_(params, clip_norm)`` would do to gradients of global 2-norm
    ``total``; ``shares`` holds each parameter's squared gradient norm."""
    coef = clip_norm / (total + 1e-6)
    denom = total * total
    dom = sorted(((n, s / denom if denom > 0 else 0.0) for n, s in shares), key=lambda t: -t[1])[:5]
    return ClipReport(clip_norm, total, coef, min(1.0, coef), coef < 1.0, dom)


def first_nonfinite(layers: list[LayerGrad], params: list[ParamGrad], kind: str | None = None) -> str | None:
    """The first gradient in backward order that holds NaN or Inf (``kind`` "nan" or "inf":
    that kind only), as "layer (gradient wrt its output|input)" or "parameter NAME"."""
    if kind is None:
        hits = [(r.first_nonfinite_seq, r.first_nonfinite_where, r) for r in layers
                if r.first_nonfinite_seq is not None]
    else:
        hits = [(*r.first_seen[kind], r) for r in layers if kind in getattr(r, "first_seen", {})]
    if hits:
        _, where, r = min(hits, key=lambda h: h[0])
        return f"{r.key} (gradient wrt its {where})"
    attr = {"nan": ("nan_count",), "inf": ("inf_count",)}.get(kind or "", ("nan_count", "inf_count"))
    bad = [p for p in params if any(getattr(p, a) for a in attr)]
    # Parameters only: backward reaches later modules first, so the last one listed.
    return f"parameter {bad[-1].name}" if bad else None


def _bad_tensors(layers: list[LayerGrad], params: list[ParamGrad], kind: str) -> list[str]:
    """Every gradient holding ``kind`` ("nan"/"inf"): layers in backward order of their first
    one (so the check's "first" leads the list), then parameters, last listed first."""
    attr = f"{kind}_count"
    found = []
    for r in layers:
        for w, s in (("output", r.grad_output), ("input", r.grad_input)):
            if s is not None and getattr(s, attr):
                first = getattr(r, "first_seen", {}).get(kind)
                seq = first[0] if first is not None else math.inf
                found.append((seq, 0 if first is not None and first[1] == w else 1, f"{r.key}:{w}"))
    found.sort(key=lambda t: (t[0], t[1]))
    return [name for _, _, name in found] + [f"param:{p.name}" for p in reversed(params) if getattr(p, attr)]


def health_checks(layers: list[LayerGrad], params: list[ParamGrad], out_norm: float,
                  vanishing_below: float, exploding_above: float) -> list[Check]:
    """The four checks. NaN/Inf: every gradient tensor holding them, the first in backward
    order named in the detail and leading ``layers``. Vanishing/exploding judge the layers
    whose output gradient is finite: a NaN or Inf norm is the NaN/Inf checks' business, and
    the finite part of such a tensor says nothing about its size (issue 29)."""
    checks = []
    for kind in ("nan", "inf"):
        bad = _bad_tensors(layers, params, kind)
        label = "NaN" if kind == "nan" else "Inf"
        detail = (f"{len(bad)} gradient tensor(s) hold {label}; first in backward order: "
                  f"{first_nonfinite(layers, params, kind)}" if bad else f"no {label} in any gradient")
        checks.append(Check(kind, "fail" if bad else "pass", float(len(bad)), 0.0, detail, bad[:20]))
    hit = [r for r in layers if r.grad_output is not None]
    reached = [r for r in hit if r.grad_output.finite]  # type: ignore[union-attr]
    skipped = [r for r in hit if not r.grad_output.finite]  # type: ignore[union-attr]
    largest = max((r.grad_output.norm for r in reached), default=0.0)  # type: ignore[union-attr]
    for r in hit:
        assert r.grad_output is not None
        norm = r.grad_output.reported().norm  # NaN or Inf for a non-finite gradient
        r.relative_norm = norm / largest if largest > 0 else None
        r.gain = norm / out_norm if out_norm > 0 else None
    left_out = (f"; {len(skipped)} layer(s) with NaN/Inf gradients left out ({skipped[0].key}"
                + (", ..." if len(skipped) > 1 else "") + ")") if skipped else ""
    if not reached or largest == 0:
        why = ("no selected layer was reached by the gradient" if not hit else
               "no selected layer has a finite gradient" if not reached else "every layer gradient is zero")
        checks.append(Check("vanishing", "skip", None, vanishing_below, why + left_out))
        checks.append(Check("exploding", "skip", None, exploding_above, why + left_out))
        return checks
    low = min(reached, key=lambda r: r.relative_norm or 0.0)
    vanished = [r.key for r in reached if (r.relative_norm or 0.0) < vanishing_below]
    checks.append(Check(
        "vanishing", "fail" if vanished else "pass", low.relative_norm, vanishing_below,
        f"smallest layer gradient norm / largest = {low.relative_norm:.3g} at '{low.key}'{left_out}", vanished[:20]))
    if out_norm == 0:
        checks.append(Check("exploding", "skip", None, exploding_above, "the output gradient is zero"))
        return checks
    high = max(reached, key=lambda r: r.gain or 0.0)
    exploded = [r.key for r in reached if (r.gain or 0.0) > exploding_above]
    checks.append(Check(
        "exploding", "fail" if exploded else "pass", high.gain, exploding_above,
        f"largest layer gradient norm / output gradient norm = {high.gain:.3g} at '{high.key}'{left_out}",
        exploded[:20]))
    return checks
