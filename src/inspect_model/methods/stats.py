"""Statistics of one tensor, computed where the tensor is (inside a hook) so it can be dropped.

``tensor_stats`` is the one place that defines mean/std/min/max/zeros/negatives/NaN/Inf for
activations and gradients alike. Non-finite values are counted, and the moments are kept
over the finite values only, so that statistics of several tensors merge exactly. What a
report shows is :meth:`TensorStats.reported`: what torch itself gives on the whole tensor
(NaN when any value is NaN, +-Inf where Inf decides it), never a finite number for a tensor
that holds NaN or Inf (issue 29: a NaN layer's norm shown as 0 read as a vanishing gradient).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
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

    @property
    def reported_abs_max(self) -> float | None:
        """max |x| as reported: NaN for a tensor holding NaN, Inf for one holding Inf."""
        return float("nan") if self.nan_count else self.reported().abs_max


# Large float32 tensors (issue 40): float32 row reductions added in float64 (methods/row_stats.py
# says why). Below this many values the exact float64 path costs little and is kept
# (bit-identical numbers for every small tensor, the ones the equality tests compare with rel=1e-9).
FAST_MIN = 1 << 16
_ROW_MAX, _ROW_MIN = 4096, 32
# |x| range within which squares and sums of a row stay normal float32 numbers.
_ABS_HI, _ABS_LO = 1e15, 1e-15


@functools.lru_cache(maxsize=256)
def _row_length(m: int) -> int:
    """The largest divisor of ``m`` in [_ROW_MIN, _ROW_MAX] (0: none)."""
    if m <= _ROW_MAX:
        return m if m >= _ROW_MIN else 0
    for d in range(_ROW_MAX, _ROW_MIN - 1, -1):
        if m % d == 0:
            return d
    return 0


def fast_stats(t: torch.Tensor, n: int | None = None,
               buf: list[torch.Tensor] | None = None) -> tuple[TensorStats, list[float] | None] | None:
    """``(tensor_stats(t), per-sample L2 norms over the first dim of size n)`` of a large
    float32 tensor, within float32 rounding of the float64 values; ``None`` where the exact
    path must run (see the module docstring). ``n``: the batch size (None: no per-sample norms);
    ``buf``: a list holding the float32 scratch tensor to reuse (grown here as needed)."""
    import torch

    x = t.detach()
    numel = x.numel()
    if x.dtype != torch.float32 or numel < FAST_MIN or x.is_complex() or x.layout != torch.strided:
        return None
    per = n is not None and x.dim() >= 1 and x.shape[0] == n and n > 0
    m = numel // n if per else numel  # type: ignore[operator]
    row = _row_length(m)
    if row == 0:
        return None
    v = x.reshape(-1)  # a copy only for a non-contiguous gradient
    rows = v.view(-1, row)
    # One read of each value by the native kernel on the CPU (issue 40); else torch's reductions.
    got = _native_rows(v, rows.shape[0], row)
    if got is None:
        lo_t, hi_t = torch.aminmax(v)
        lo, hi = float(lo_t), float(hi_t)
    else:
        lo, hi, zeros, negatives, s1, l2sq, l1, sq = got
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None  # NaN or Inf: counted on the exact path
    big = max(-lo, hi)
    if big > _ABS_HI or (0 < big < _ABS_LO):
        return None
    if got is None:
        zeros, negatives, l1, r = _torch_counts(v, rows, buf)
        sq = r[1].square()
        s1, l2sq = (float(a) for a in torch.stack([r[0].sum(), sq.sum()]))
    mean = s1 / numel
    var = max(l2sq / numel - mean * mean, 0.0)
    if big > 0 and var < 1e-2 * (l2sq / numel):
        return None  # var = E[x^2] - mean^2 would cancel float32 digits: the exact path
    std = math.sqrt(var * numel / (numel - 1))
    norms = (sq.reshape(n, -1).sum(1) ** 0.5).tolist() if per else None  # torch or numpy
    stats = TensorStats(numel=numel, mean=mean, std=std, min=lo, max=hi, abs_mean=l1 / numel,
                        norm=math.sqrt(l2sq), zero_fraction=zeros / numel, negative_fraction=negatives / numel,
                        nan_count=0, inf_count=0, neg_inf_count=0)
    return stats, norms


def _native_rows(v: torch.Tensor, rows: int, row: int) -> tuple[float, float, int, int, float, float, float,
                                                                  np.ndarray] | None:
    """(min, max, zeros, negatives, sum, sum of squares, sum of |v|, per-row sums of squares)
    of the contiguous float32 CPU values ``v`` read as ``rows`` rows of ``row``, from one read
    by the native kernel of ``activations`` (methods/activations/kernel.py, ``im_rows_f32``:
    its OpenMP loop runs on torch's threads); ``None`` without the kernel, off the CPU, or with
    NaN/Inf among the values (their sums say so)."""
    if v.device.type != "cpu" or not v.is_contiguous():
        return None
    import numpy as np

    from inspect_model.methods.activations import kernel

    table = kernel.grad_rows(v, rows, row)
    if table is None:
        return None
    a = table.numpy()  # read at once: the kernel's buffer is reused two calls later
    sums = a[:, :3].sum(0)
    if not np.isfinite(sums).all():
        return None
    return (float(a[:, 3].min()), float(a[:, 4].max()), round(float(a[:, 5].sum())),
            round(float(a[:, 6].sum())), float(sums[0]), float(sums[1]), float(sums[2]), a[:, 1].copy())


def _torch_counts(v: torch.Tensor, rows: torch.Tensor, buf: list[torch.Tensor] | None
                  ) -> tuple[int, int, float, torch.Tensor]:
    """(zeros, negatives, L1 norm, (2, R) float64 per-row sums and L2 norms) by torch alone."""
    import torch

    numel = v.numel()
    f64 = torch.float64
    # sign() once, into a reused buffer: its row sums are positives - negatives and its row
    # L2 norms squared positives + negatives (float32 integers below 2^24: exact), both at
    # the speed of a plain reduction (count_nonzero and (x < 0).sum() are 5-20x slower).
    if buf is None:
        buf = []
    if not buf or buf[0].numel() < numel or buf[0].device != v.device:
        buf[:] = [torch.empty_like(v)]
    sg = torch.sign(rows, out=buf[0][:numel].view(rows.shape))
    counts = torch.stack([sg.sum(1), torch.linalg.vector_norm(sg, 2, 1)])
    ab = torch.abs(rows, out=sg)  # |x| into the same buffer: its row sums are the L1 norms
    # (3, R): per-row sum, L2 norm, L1 norm in float32, then float64 from here on.
    r = torch.stack([rows.sum(1), torch.linalg.vector_norm(rows, 2, 1), ab.sum(1)]).to(f64)
    c = counts.to(f64)
    l1, signed, nonzero = (float(a) for a in torch.stack([r[2].sum(), c[0].sum(), c[1].square().round().sum()]))
    zeros = numel - round(nonzero)
    return zeros, round((nonzero - signed) / 2), l1, r[:2]


def tensor_stats(t: torch.Tensor, *, exact: bool = False) -> TensorStats:
    """Statistics of ``t`` (any shape, any floating or integer dtype); large float32 tensors
    by row reductions (:mod:`inspect_model.methods.row_stats`) unless ``exact``."""
    import torch

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
