"""Few-pass measurement of a layer's output (issue 40): the statistics of
:func:`~inspect_model.methods.activations.measure.measure` from as few reads of the tensor as
the numbers allow, and none at all where the numbers follow from an earlier measurement.

What each statistic needs, and so what is read:

* per channel (the report's channel means, dead channels): only each (image, channel) cell's
  sum, one ``sum`` over the cell dims per candidate channel dim;
* per image (moments, min, max, zero and negative counts): reductions over the whole image as
  one long contiguous row (``amin``, ``amax``, the L2 norm for the sum of squares), fast at
  every cell size (a reduction over rows of 49 values, a 7x7 map, ran 3-5x slower per value
  than one over long rows); the counts from one ``sign()`` pass into a reused buffer (its sum,
  and its L2 norm where negatives are present), skipped where min and max settle them;
* a channel is dead in an image when its cell is all zero: no cell can be when the image has
  no zeros; in an image with no negative values exactly the cells whose sum is 0; otherwise
  those cells are the only candidates and are checked value by value.

A ReLU applied in place to the tensor just measured (same tensor object, its version counter
one step on) gives its statistics from that measurement and two reads: min and max are
``max(., 0)`` of the input's, the zeros are the input's zeros and negatives, there are no
negatives, and the cell sums and the sum of squares are read (:func:`measure_fused` with
``after_relu``). An output that *is* the tensor just measured, unchanged (Identity, Dropout in
eval mode), is not read again at all (``ActivationCapture``).

Sums accumulate in float32 over rows of at most 2^20 values and are added in float64, as the
chunked path of ``measure`` does; counts are exact (float32 holds integers to 2^24). The sum
of squares minus n mean^2 cancels when the mean is far from zero against the spread: an image
whose variance would lose more than three of float32's seven digits is measured again
exactly, in float64. Tensors holding NaN or Inf, or whose float32 sums overflow, and dtypes
other than float32, float16 and bfloat16 go to the chunked exact path (returns ``None``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from inspect_model.methods.activations.moments import Channels, Measurement, Moments

# Values per chunk of the per-image passes: a chunk and its sign() buffer stay in cache.
CHUNK_ELEMENTS = 1 << 20
# Per image row and chunk at most this many values: the count read back from the L2 norm of
# sign() values (sqrt of an integer in float32, squared) rounds back exactly below 2^21.
_ROW_LIMIT = 1 << 21
_FLOATS = ("torch.float32", "torch.float16", "torch.bfloat16")


@dataclass(frozen=True)
class Bounds:
    """Per image: min, max, zero and negative counts (float64 numpy arrays, all finite)."""

    lo: np.ndarray
    hi: np.ndarray
    zeros: np.ndarray
    negatives: np.ndarray


def measure_fused(x: torch.Tensor, cands: list[tuple[int, int]], *, after_relu: Bounds | None = None
                  ) -> tuple[list[Moments], dict[int, Channels], dict[int, list[float]], Bounds] | None:
    """Per-image moments, channels and dead fractions of ``x`` (N, ...), images along dim 0;
    ``cands``: (key, dim of x) of each candidate channel dim. ``after_relu``: ``x`` is the
    ReLU, in place, of a tensor with these bounds (module docstring). ``None``: take the
    chunked path (non-finite values, overflow, another dtype, a strided tensor)."""
    import numpy as np
    import torch

    if str(x.dtype) not in _FLOATS or x.ndim < 1 or x.numel() == 0 or not x.is_contiguous():
        return None
    n = int(x.shape[0])
    flat = x.view(n, -1)  # (N, M): each image one contiguous row
    m = int(flat.shape[1])
    acc = torch.float32
    cells: dict[int, torch.Tensor] = {}
    for key, dim in cands:  # (N, C) cell sums per candidate channel dim
        rest = tuple(d for d in range(1, x.ndim) if d != dim)
        cells[key] = x.sum(rest, dtype=acc) if rest else x.to(acc, copy=True)
    limit = CHUNK_ELEMENTS if x.device.type == "cpu" else _ROW_LIMIT * 8
    step = max(1, min(_ROW_LIMIT, limit // n))
    buf: list[torch.Tensor] = []  # the sign() buffer, shared by the chunks
    parts = [_chunk(flat[:, c0:c0 + step], after_relu is not None, not cands, buf) for c0 in range(0, m, step)]
    if any(p is None for p in parts):
        return None
    # One copy back: 6 rows of N per chunk, then the cell sums' image totals.
    table = torch.stack([r for p in parts for r in p]).to(torch.float64)  # type: ignore[union-attr]
    if cands:  # the image sums from the cell sums (an infinite or NaN cell makes its image's so)
        table = torch.cat([table, cells[cands[0][0]].to(torch.float64).sum(1, keepdim=True).T])
    flat_arr = table.cpu().numpy()
    if not np.isfinite(flat_arr).all():
        return None  # NaN/Inf in the values, or a float32 sum overflowed
    arr = flat_arr[:6 * len(parts)].reshape(len(parts), 6, n)
    s1 = flat_arr[-1] if cands else arr[:, 0].sum(0)
    sumsq = np.square(arr[:, 1]).sum(0)
    if after_relu is not None:
        lo, hi = np.maximum(after_relu.lo, 0.0), np.maximum(after_relu.hi, 0.0)
        zeros, neg = after_relu.zeros + after_relu.negatives, np.zeros(n)
    else:
        lo, hi = arr[:, 2].min(0), arr[:, 3].max(0)
        # the squared L2 norm of sign() values: an integer count (sqrt in float32, squared, rounded)
        signed, nonzero = arr[:, 4].sum(0), np.round(np.square(arr[:, 5])).sum(0)
        zeros, neg = m - nonzero, (nonzero - signed) / 2
    bounds = Bounds(lo, hi, zeros, neg)
    samples = _moments(flat, m, s1, sumsq, bounds)
    channels: dict[int, Channels] = {}
    dead_fraction: dict[int, list[float]] = {}
    for key, dim in cands:
        channels[key], dead_fraction[key] = _channels(x, dim, key, cells[key], bounds)
    return samples, channels, dead_fraction, bounds


def _chunk(xc: torch.Tensor, nonneg_known: bool, want_sum: bool, buf: list[torch.Tensor]
           ) -> list[torch.Tensor] | None:
    """Six rows of N raw sums of one chunk (N, s) of image rows, float32: sum (when no cell sums
    give it), L2 norm, min, max, sum of sign() and the L2 norm of sign() (the square root of
    the number of non-zero values)."""
    import torch

    acc = torch.float32
    n, s = int(xc.shape[0]), int(xc.shape[1])
    norm = torch.linalg.vector_norm(xc, 2, 1, dtype=acc)
    total = xc.sum(1, dtype=acc) if want_sum else torch.zeros_like(norm)
    if nonneg_known:  # bounds and counts come from the measurement before the ReLU
        return [total, norm, norm, norm, norm, norm]
    lo, hi = xc.amin(1), xc.amax(1)
    if xc.device.type == "cpu":  # two numbers, read while the chunk is in cache
        a, b = float(lo.min()), float(hi.max())
        if not (math.isfinite(a) and math.isfinite(b)):
            return None
        if a > 0 or b < 0:  # no value is zero: every value has the sign of the bounds
            signed = torch.full((n,), float(s) if a > 0 else -float(s), dtype=acc)
            return [total, norm, lo.to(acc), hi.to(acc), signed, torch.full((n,), math.sqrt(s), dtype=acc)]
        nonneg = a >= 0
    else:  # an accelerator: no synchronisation per chunk; finiteness is checked at the end
        nonneg = False
    if not buf or buf[0].numel() < xc.numel():
        buf[:] = [torch.empty(xc.numel(), dtype=xc.dtype, device=xc.device)]
    sg = torch.sign(xc, out=buf[0][:xc.numel()].view(xc.shape))
    signed = sg.sum(1, dtype=acc)
    # After a ReLU sign() is 0 or 1 and its sum counts the non-zeros; elsewhere the squared
    # L2 norm of the sign() values counts them (positives + negatives: two reads, no write).
    root = signed.sqrt() if nonneg else torch.linalg.vector_norm(sg, 2, 1, dtype=acc)
    return [total, norm, lo.to(acc), hi.to(acc), signed, root]


def _moments(flat: torch.Tensor, m: int, s1: np.ndarray, sumsq: np.ndarray, b: Bounds) -> list[Moments]:
    """One :class:`Moments` per image; an image whose variance cancels is summed again in
    float64 (module docstring)."""
    import numpy as np
    import torch

    from inspect_model.methods.activations.moments import Moments

    mean = s1 / m
    m2 = np.maximum(sumsq - m * np.square(mean), 0.0)
    m2[b.lo == b.hi] = 0.0  # a constant image: exactly 0, no rounding residue
    for i in np.nonzero((b.lo < b.hi) & (m2 * 1e3 < sumsq))[0].tolist():
        d = flat[i].to(torch.float64) - float(mean[i])
        m2[i] = float(torch.dot(d, d))
    return [Moments(numel=m, count=m, mean=float(mean[i]), m2=float(m2[i]), min=float(b.lo[i]), max=float(b.hi[i]),
                    zeros=int(b.zeros[i]), negatives=int(b.negatives[i])) for i in range(len(mean))]


def _channels(x: torch.Tensor, dim: int, key: int, sums: torch.Tensor, b: Bounds) -> tuple[Channels, list[float]]:
    """Channel sums and dead channels from the (N, C) cell sums (module docstring)."""
    import numpy as np
    import torch

    from inspect_model.methods.activations.moments import Channels

    n, c = int(sums.shape[0]), int(sums.shape[1])
    cell = x.numel() // max(1, n * c)
    total = sums.to(torch.float64).sum(0).cpu()
    if not (b.zeros > 0).any():  # no zero anywhere: no dead cell (the common case of signed values)
        return Channels(dim=key, sums=total, counts=float(n * cell), dead=torch.zeros(c, dtype=torch.bool)), [0.0] * n
    dead = (sums == 0).cpu().numpy() & (b.zeros > 0)[:, None]  # (N, C)
    for i in np.nonzero((b.lo < 0) & dead.any(1))[0].tolist():  # signed values: check the candidates
        idx = np.nonzero(dead[i])[0]
        vals = x[i].movedim(dim - 1, 0)[torch.from_numpy(idx).to(x.device)].reshape(len(idx), -1)
        dead[i, idx] = (vals == 0).all(1).cpu().numpy()
    ch = Channels(dim=key, sums=total, counts=float(n * cell), dead=torch.from_numpy(dead.all(0)))
    return ch, dead.mean(1).tolist()


def relu_after(module: Any) -> bool:
    """``module`` is a plain ``nn.ReLU(inplace=True)``: its output is its input, clamped at 0."""
    from torch import nn

    return type(module) is nn.ReLU and bool(module.inplace) and "forward" not in vars(module)
