"""One-read measurement of a float32 layer output on the CPU (issue 40), through the native
kernel of :mod:`~inspect_model.methods.activations.kernel`: the same numbers as
:func:`~inspect_model.methods.activations.fused.measure_fused` (moments per image, channel sums,
dead channels, the bounds a ReLU after it needs) from one read of each value.

The kernel's rows are the (image, channel) cells when channels are dim 1 and a cell holds at
least ``MIN_CELL`` values (a conv or norm output), else whole images. From each cell's shifted
sums come its mean and sum of squared deviations, merged per image by Chan's update (no
cancellation when the mean is far from zero: each row is shifted by a value of its own); the
channel sums and dead cells (every value zero: zeros == cell size) come from the same rows.
A cell whose squared deviations still lost more than three digits has its image measured
again in float64, as ``fused`` does. Other channel dims are summed by torch.

A ReLU applied in place to the tensor just measured is not read at all: the kernel kept the
moments of each row's positive part too, so its table follows from the one before it.
Anything else (another dtype or device, a strided tensor, NaN/Inf, no compiler) returns
``None`` and the torch path runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.methods.activations.fused import Bounds

if TYPE_CHECKING:
    import numpy as np
    import torch

    from inspect_model.methods.activations.moments import Channels, Moments

MIN_CELL = 16


@dataclass(frozen=True)
class CellBounds(Bounds):
    """:class:`Bounds` with the kernel's table (``rows`` x 10, float64) and its row length:
    an in-place ReLU of the same tensor is derived from them."""

    table: Any = None
    s: int = 0
    stamp: tuple[int, int] = (0, 0)  # kernel.stamp() when made: the table lives in a reused buffer


def measure_native(x: torch.Tensor, cands: list[tuple[int, int]]
                   ) -> tuple[list[Moments], dict[int, Channels], dict[int, list[float]], Bounds] | None:
    """``measure_fused``'s result for ``x`` (N, ...) from the native kernel, or ``None``.
    The kernel leaves out the positive part's moments: no ReLU's table is derived from this one."""
    import torch

    from inspect_model.methods.activations import kernel

    if x.device.type != "cpu" or x.dtype != torch.float32 or x.ndim < 1 or x.numel() == 0 \
            or not x.is_contiguous():
        return None
    n = int(x.shape[0])
    m = x.numel() // n
    grouped = bool(cands) and cands[0][1] == 1 and x.ndim >= 3 and m // int(x.shape[1]) >= MIN_CELL
    c = int(x.shape[1]) if grouped else 1
    rows, s = n * c, m // c
    # A ReLU in place is read like any output, never derived from its input's table: the
    # derivation's sums (unshifted positive parts) differ from a read's (shifted) in the last
    # bits, and whether a ReLU is derived depends on hooks around it (accelerate's offload,
    # --tensorboard's histograms): the same layer must give the same numbers either way. So
    # the positive part's moments are never needed.
    table = kernel.cells(x, rows, s, False)
    if table is None:
        return None
    merged = kernel.images(table, n, c, s)
    if merged is None:
        return None  # NaN/Inf among the values, or a float32 sum of squares overflowed
    img, sums, dead, lost = merged
    if lost:
        _exact_cells(x, table.numpy(), img, n, c, s)
    # Views of kernel.images' reused array: read in this call and, as a CellBounds, only by
    # the next measurement's stamp check (measure.py hands none to the torch path).
    bounds = CellBounds(img[:, 2], img[:, 3], img[:, 4], img[:, 5], table=table, s=s, stamp=kernel.stamp())
    samples = _samples(img, s * c)
    channels: dict[int, Channels] = {}
    dead_fraction: dict[int, list[float]] = {}
    for key, dim in cands:
        if grouped and dim == 1:
            from inspect_model.methods.activations.moments import Channels

            channels[key] = Channels(dim=key, sums=sums, counts=float(n * s), dead=dead)
            dead_fraction[key] = img[:, 6].tolist()
        else:
            from inspect_model.methods.activations.fused import _channels

            rest = tuple(d for d in range(1, x.ndim) if d != dim)
            sums_d = x.sum(rest, dtype=torch.float32) if rest else x.to(torch.float32, copy=True)
            channels[key], dead_fraction[key] = _channels(x, dim, key, sums_d, bounds)
    return samples, channels, dead_fraction, bounds


def _samples(img: np.ndarray, m: int) -> list[Moments]:
    """One :class:`Moments` per image from kernel.images' per-image rows."""
    from inspect_model.methods.activations.moments import Moments

    # positional: numel, count, mean, m2, min, max, zeros, negatives (half the cost of keywords)
    return [Moments(m, m, r[0], r[1], r[2], r[3], int(r[4]), int(r[5])) for r in img.tolist()]


def _exact_cells(x: torch.Tensor, a: np.ndarray, img: np.ndarray, n: int, c: int, s: int) -> None:
    """The m2 of each image with a cell whose squared deviations lost more than three digits,
    merged again with those cells' m2 summed exactly in float64 about their mean."""
    import numpy as np
    import torch

    cm = a[:, 0] + a[:, 1] / s
    cm2 = np.maximum(a[:, 2] - a[:, 1] * a[:, 1] / s, 0.0)
    cm2[a[:, 3] == a[:, 4]] = 0.0
    bad = np.nonzero((cm2 * 1e3 < a[:, 2]) & (a[:, 3] < a[:, 4]))[0]
    rows = x.view(n * c, s)
    for r in bad.tolist():
        v = rows[r].to(torch.float64)
        cm[r] = float(v.mean())
        d = v - cm[r]
        cm2[r] = float(torch.dot(d, d))
    for i in np.unique(bad // c).tolist():
        sl = slice(i * c, (i + 1) * c)
        mean = float((cm[sl] * s).sum() / (s * c))
        img[i, 0], img[i, 1] = mean, float(cm2[sl].sum() + s * np.square(cm[sl] - mean).sum())
