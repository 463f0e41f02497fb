"""The numbers of one matched pair of layer outputs, accumulated over calls and batches.

Side A is the reference: relative error ``‖a−b‖/‖a‖``, max ``|a−b|``, cosine similarity,
the share of elements beyond the tolerance (``|a−b| > tol + tol·|a|``, numpy's ``isclose``
with rtol = atol = tol), and for a reduced-precision side B the values of A that B's dtype
cannot hold: overflow (``|a|`` above the dtype's largest finite value) and underflow (non-zero
``|a|`` below its smallest normal). Sums are kept in float64, so a layer's numbers over several
batches are those of all its elements at once. Non-finite elements are counted, and left out
of the sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PairSums:
    """Running sums of one layer's pairs (see the module docstring)."""

    elements: int = 0
    sq_a: float = 0.0  # Σ a²
    sq_b: float = 0.0
    sq_d: float = 0.0  # Σ (a−b)²
    max_abs: float = 0.0
    beyond: int = 0
    overflow: int = 0
    underflow: int = 0
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    calls: int = 0
    shape: tuple[int, ...] | None = None
    other_shape: tuple[int, ...] | None = None  # B's, when it differs from A's
    missing: int = 0  # calls of A with no output of B to compare
    notes: list[str] = field(default_factory=list)

    def add(self, a: Any, b: Any, tolerance: float, low: Any = None) -> None:
        """One call's pair: ``a`` (A's output) and ``b`` (B's), any dtype or device; ``low``:
        the reduced-precision dtype whose range is checked (None: none)."""
        import torch

        self.calls += 1
        if b is None:
            self.missing += 1
            return
        if self.shape is None:
            self.shape = tuple(int(s) for s in a.shape)
        if tuple(a.shape) != tuple(b.shape):
            self.other_shape = tuple(int(s) for s in b.shape)
            return
        work = torch.float64 if a.dtype == torch.float64 else torch.float32
        x = a.detach().reshape(-1).to(work)
        y = b.detach().reshape(-1).to(device=x.device, dtype=work)
        if low is not None:
            self._range(x, low)
        # Few torch calls per layer (torch.equal is no shortcut: it is not vectorised, 7x a dot).
        d = x - y
        sq_d = float(torch.dot(d, d))
        if sq_d == 0.0:  # every element equal (a NaN never is): nothing beyond, max 0
            sq = float(torch.dot(x, x))
            if math.isfinite(sq):
                self.elements += int(x.numel())
                self.sq_a += sq
                self.sq_b += sq
                return
        sq_a, sq_b, mx = torch.stack((torch.dot(x, x), torch.dot(y, y),
                                      d.abs_().max() if d.numel() else d.new_zeros(()))).tolist()
        if not all(math.isfinite(v) for v in (sq_a, sq_b, sq_d)):  # a NaN/Inf (or a huge value): the careful path
            ok_x, ok_y = torch.isfinite(x), torch.isfinite(y)
            self.nonfinite_a += int((~ok_x).sum())
            self.nonfinite_b += int((~ok_y).sum())
            keep = ok_x & ok_y
            x, y = x[keep], y[keep]
            d = x - y
            sq_a, sq_b, sq_d = float(torch.dot(x, x)), float(torch.dot(y, y)), float(torch.dot(d, d))
            mx = float(d.abs_().max()) if d.numel() else 0.0
        self.elements += int(x.numel())
        self.sq_d += sq_d
        self.sq_a += sq_a
        self.sq_b += sq_b
        self.max_abs = max(self.max_abs, mx)
        if mx > tolerance:  # else no element is beyond tol + tol·|a| (>= tol); d is |a−b| here
            self.beyond += int(torch.count_nonzero(d.sub_(x.abs(), alpha=tolerance) > tolerance))  # |a−b| − tol·|a| > tol

    def _range(self, x: Any, low: Any) -> None:
        import torch

        info = torch.finfo(low)
        mag = x.abs()
        self.overflow += int((mag > info.max).sum())
        self.underflow += int(((mag > 0) & (mag < info.tiny)).sum())

    # ------------------------------------------------------------------ results
    @property
    def compared(self) -> bool:
        return self.elements > 0 or (self.calls > self.missing and self.other_shape is None)

    def relative_error(self) -> float | None:
        if not self.compared:
            return None
        if self.sq_d == 0.0:
            return 0.0
        return math.sqrt(self.sq_d) / math.sqrt(self.sq_a) if self.sq_a > 0 else math.inf

    def cosine(self) -> float | None:
        if not self.compared:
            return None
        if self.sq_d == 0.0:
            return 1.0
        na, nb = math.sqrt(self.sq_a), math.sqrt(self.sq_b)
        if na == 0 or nb == 0:
            return 0.0
        # 1 - cos = (‖a−b‖² − (‖a‖−‖b‖)²) / (2‖a‖‖b‖): from the difference itself, so near-equal layers
        # keep their 1 − cos (a·b/(‖a‖‖b‖) in float32 would round it away below ~1e-7).
        return max(-1.0, min(1.0, 1.0 - (self.sq_d - (na - nb) ** 2) / (2 * na * nb)))

    def beyond_share(self) -> float | None:
        return self.beyond / self.elements if self.elements else (0.0 if self.compared else None)


def top1_agreement(a: Any, b: Any) -> float | None:
    """The share of rows whose argmax over the last dimension is the same (logits (N, C) or
    (N, L, V)); None for anything else."""
    if a.dim() < 2 or tuple(a.shape) != tuple(b.shape) or not a.is_floating_point():
        return None
    ia = a.detach().argmax(dim=-1)
    ib = b.detach().to(a.device).argmax(dim=-1)
    return float((ia == ib).float().mean())
