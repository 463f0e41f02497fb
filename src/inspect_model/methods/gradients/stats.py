"""Streaming statistics of gradients for ``inspect-model grads``: the log10|g| histogram
(:class:`LogHist`, with fixed bin edges so that histograms of several batches add up exactly),
its computation inside the tensor hook (:func:`log_hist`), and the exact merge of two
:class:`TensorStats` from their statistics alone (:func:`merge_stats`), so that a run over
many batches never keeps a gradient tensor."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inspect_model.methods.stats import TensorStats

if TYPE_CHECKING:
    import torch

# Histograms of log10|g|: fixed edges so that batches merge exactly; values outside the
# range fall into the end bins, exact zeros are counted apart.
HIST_LO, HIST_HI, HIST_BINS = -12.0, 6.0, 72
# A gradient of more values than this is histogrammed from an evenly strided sample of
# about this many, its counts scaled to the exact number of non-zero finite values (the
# zeros, Inf and NaN counts stay exact): the picture's shape is the same, at a fraction
# of the cost of a log10 and a histc over every value in the hook (issue 15's grads -o).
HIST_SAMPLE = 1 << 18


@dataclass
class LogHist:
    """Histogram of log10|g| over the non-zero finite values, plus the zeros."""

    counts: list[int] = field(default_factory=lambda: [0] * HIST_BINS)
    zeros: int = 0
    sum: float = 0.0  # of log10|g|, for TensorBoard's raw histogram
    sum_squares: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @staticmethod
    def edges() -> list[float]:
        w = (HIST_HI - HIST_LO) / HIST_BINS
        return [HIST_LO + i * w for i in range(HIST_BINS + 1)]

    def add(self, other: LogHist) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.zeros += other.zeros
        self.sum += other.sum
        self.sum_squares += other.sum_squares
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)


def log_hist(g: torch.Tensor, *, zeros: int | None = None, infs: int | None = None,
             nans: int | None = None) -> LogHist:
    """Histogram of log10|g| (values beyond the range go to the end bins; zeros and
    non-finite values are left out, zeros counted apart). ``sum``/``min``/``max`` are taken
    from the bin centres and edges: one cheap pass per statistic, in the hook. ``zeros``,
    ``infs`` and ``nans``, when the caller has counted them already (``tensor_stats``),
    save passes. Over :data:`HIST_SAMPLE` values the bins come from a strided sample."""
    import torch

    flat = g.detach().reshape(-1)
    step = max(1, flat.numel() // HIST_SAMPLE)
    block = 1024  # the sample is every step-th block of contiguous values: 1/step of the memory read
    if zeros is None:
        zeros = int((flat == 0).sum())
    if infs is None:
        infs = int(torch.isinf(flat).sum()) if flat.is_floating_point() else 0
    if nans is None:
        nans = int(torch.isnan(flat).sum()) if flat.is_floating_point() else 0
    if step == 1:
        a = flat.abs()  # a new tensor: the in-place ops below touch only it
    else:
        rows = flat[:flat.numel() // block * block].view(-1, block)
        a = rows[::step].reshape(-1).abs()
    if a.dtype != torch.float32:
        a = a.float()
    s_zeros, s_infs = (zeros, infs) if step == 1 else (int((a == 0).sum()), int(torch.isinf(a).sum()))
    torch.log10(a, out=a)
    a.clamp_(HIST_LO, HIST_HI - 1e-6)  # zeros -> first bin, inf -> last; NaN stays NaN
    counts = torch.histc(a, HIST_BINS, HIST_LO, HIST_HI).long().tolist()  # histc ignores NaN
    counts[0] -= s_zeros
    counts[-1] -= s_infs
    if step > 1:
        counts = _scaled(counts, flat.numel() - zeros - infs - nans)
    h = LogHist(counts=counts, zeros=zeros)
    edges = LogHist.edges()
    used = [i for i, c in enumerate(counts) if c]
    if used:
        centres = [(edges[i] + edges[i + 1]) / 2 for i in range(HIST_BINS)]
        h.sum = sum(c * m for c, m in zip(counts, centres))
        h.sum_squares = sum(c * m * m for c, m in zip(counts, centres))
        h.min, h.max = edges[used[0]], edges[used[-1] + 1]
    return h


def _scaled(counts: list[int], total: int) -> list[int]:
    """``counts`` of a sample scaled to add up to ``total`` exactly (largest remainders)."""
    have = sum(counts)
    if have <= 0 or total <= 0:
        return [0] * len(counts)
    raw = [c * total / have for c in counts]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


def merge_stats(a: TensorStats | None, b: TensorStats | None) -> TensorStats | None:
    """Statistics of the concatenation of two tensors, from their statistics alone."""
    if a is None or b is None:
        return a if b is None else b
    fa, fb = a.numel - a.nan_count - a.inf_count, b.numel - b.nan_count - b.inf_count
    nf, numel = fa + fb, a.numel + b.numel
    nan_count, inf_count = a.nan_count + b.nan_count, a.inf_count + b.inf_count
    neg_inf = a.neg_inf_count + b.neg_inf_count
    if nf == 0:
        nan = float("nan")
        return TensorStats(numel, nan, nan, nan, nan, nan, nan,
                           (a.zero_fraction * a.numel + b.zero_fraction * b.numel) / numel, 0.0,
                           nan_count, inf_count, neg_inf)

    def part(s: TensorStats, f: int, attr: str) -> float:
        return getattr(s, attr) * f if f else 0.0

    s1 = part(a, fa, "mean") + part(b, fb, "mean")
    s2 = (a.norm if fa else 0.0) ** 2 + (b.norm if fb else 0.0) ** 2
    mean = s1 / nf
    var = max(s2 / nf - mean * mean, 0.0)
    finite = [s for s, f in ((a, fa), (b, fb)) if f]
    return TensorStats(
        numel=numel, mean=mean, std=math.sqrt(var * nf / (nf - 1)) if nf > 1 else 0.0,
        min=min(s.min for s in finite), max=max(s.max for s in finite),
        abs_mean=(part(a, fa, "abs_mean") + part(b, fb, "abs_mean")) / nf, norm=math.sqrt(s2),
        zero_fraction=(a.zero_fraction * a.numel + b.zero_fraction * b.numel) / numel,
        negative_fraction=(a.negative_fraction * a.numel + b.negative_fraction * b.numel) / numel,
        nan_count=nan_count, inf_count=inf_count, neg_inf_count=neg_inf,
    )


def max_abs(s: TensorStats | None) -> float | None:
    """max |g| as reported: NaN for a tensor holding NaN, Inf for one holding Inf."""
    if s is None:
        return None
    return float("nan") if s.nan_count else s.reported().abs_max
