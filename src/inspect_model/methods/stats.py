"""Statistics of one tensor, computed where the tensor is (inside a hook) so it can be dropped.

``tensor_stats`` is the one place that defines mean/std/min/max/zeros/negatives/NaN/Inf for
activations and gradients alike. Non-finite values are counted, and the moments are kept
over the finite values only, so that statistics of several tensors merge exactly. What a
report shows is :meth:`TensorStats.reported`: what torch itself gives on the whole tensor
(NaN when any value is NaN, +-Inf where Inf decides it), never a finite number for a tensor
that holds NaN or Inf (issue 29: a NaN layer's norm shown as 0 read as a vanishing gradient).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorStats:
    """Summary statistics of a tensor; moments over its finite values (see :meth:`reported`)."""

    numel: int
    mean: float
    std: float
    min: float
    max: float
    abs_mean: float
    norm: float  # L2 norm of the finite values
    zero_fraction: float
    negative_fraction: float
    nan_count: int
    inf_count: int
    neg_inf_count: int = 0  # of inf_count, the -Inf values

    @property
    def finite(self) -> bool:
        return self.nan_count == 0 and self.inf_count == 0

    @property
    def abs_max(self) -> float | None:
        """max |x| over the finite values; None when there are none."""
        if math.isnan(self.min):
            return None
        return max(abs(self.min), abs(self.max))

    def reported(self) -> TensorStats:
        """The statistics of the whole tensor as torch computes them (``torch.linalg.norm``,
        ``mean``, ``std``, ``aminmax``): NaN when any value is NaN; with Inf and no NaN the norm
        and mean |x| are Inf, the std NaN, the mean, min and max +-Inf as the signs decide."""
        if self.finite:
            return self
        nan, inf = float("nan"), float("inf")
        if self.nan_count:
            return replace(self, mean=nan, std=nan, min=nan, max=nan, abs_mean=nan, norm=nan)
        pos, neg = self.inf_count - self.neg_inf_count, self.neg_inf_count
        mean = nan if pos and neg else (inf if pos else -inf)
        no_finite = math.isnan(self.min)
        lo = -inf if neg else (inf if no_finite else self.min)
        hi = inf if pos else (-inf if no_finite else self.max)
        return replace(self, mean=mean, std=nan, min=lo, max=hi, abs_mean=inf, norm=inf)

    def to_dict(self) -> dict[str, Any]:
        """The reported statistics (:meth:`reported`); JSON writes NaN and Inf as null."""
        return asdict(self.reported())


def tensor_stats(t: torch.Tensor, *, exact: bool = False) -> TensorStats:
    """Statistics of ``t`` (any shape, any floating or integer dtype); large float32 tensors
    by row reductions (:mod:`inspect_model.methods.row_stats`) unless ``exact``."""
    import torch

    from inspect_model.methods.row_stats import FAST_MIN, fast_stats

    x = t.detach()
    if not exact and x.dtype == torch.float32 and x.numel() >= FAST_MIN:  # memory speed, within float32 rounding
        fast = fast_stats(x)
        if fast is not None:
            return fast[0]
    if x.is_complex():
        x = x.abs()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    elif x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    numel = x.numel()
    if numel == 0:
        nan = float("nan")
        return TensorStats(0, nan, nan, nan, nan, nan, 0.0, 0.0, 0.0, 0, 0)
    x = x.reshape(-1)
    zero_count = numel - int(torch.count_nonzero(x))  # NaN and Inf are not zero
    nan_count = inf_count = neg_inf_count = 0
    # Sums accumulate in float64 (float32 loses digits over 10^7 values) without copying
    # the tensor to float64: reductions take an accumulation dtype.
    s1 = float(x.sum(dtype=torch.float64))
    # A float64 sum of float32 values cannot overflow: it is finite iff every value is,
    # which saves a pass over the tensor in the common case.
    surely_finite = math.isfinite(s1) and x.dtype != torch.float64
    if not surely_finite and not bool(torch.isfinite(x).all()):
        finite_mask = torch.isfinite(x)
        nan_count = int(torch.isnan(x).sum())
        inf_count = numel - int(finite_mask.sum()) - nan_count
        neg_inf_count = int((x == -math.inf).sum()) if inf_count else 0
        x = x[finite_mask]
        s1 = float(x.sum(dtype=torch.float64))
    n_finite = x.numel()
    if n_finite == 0:
        nan = float("nan")
        return TensorStats(numel, nan, nan, nan, nan, nan, nan, zero_count / numel, 0.0, nan_count, inf_count,
                           neg_inf_count)
    l2 = float(torch.linalg.vector_norm(x, 2, dtype=torch.float64))
    l1 = float(torch.linalg.vector_norm(x, 1, dtype=torch.float64))
    mean = s1 / n_finite
    var = max(l2 * l2 / n_finite - mean * mean, 0.0)
    # Unbiased std as torch.std gives, so reports match what users compute themselves.
    std = math.sqrt(var * n_finite / (n_finite - 1)) if n_finite > 1 else 0.0
    lo, hi = torch.aminmax(x)
    return TensorStats(
        numel=numel,
        mean=mean,
        std=std,
        min=float(lo),
        max=float(hi),
        abs_mean=l1 / n_finite,
        norm=l2,
        zero_fraction=zero_count / numel,
        negative_fraction=float((x < 0).sum()) / numel,
        nan_count=nan_count,
        inf_count=inf_count,
        neg_inf_count=neg_inf_count,
    )
