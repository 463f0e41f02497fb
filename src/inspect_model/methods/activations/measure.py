"""Measurement of layer outputs for ``inspect-model activations``: what the forward hook
computes from one output tensor before dropping it (:func:`measure`), as mergeable moments
per image and per channel (:class:`Moments`, :class:`Channels`, :class:`Measurement`), the
summary they give (:class:`ActivationStats`), and which dimension of an output holds the
channels (:func:`choose_channel_dim`); the rules are set out in the docstring of
:mod:`inspect_model.methods.activations.capture`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.methods.activations.moments import ActivationStats, Channels, Measurement, Moments

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["ActivationStats", "Channels", "Measurement", "Moments", "choose_channel_dim", "measure"]

# Elements per chunk when measuring: bounds the temporaries of the hook (a sign() copy, or
# on the NaN/Inf path a float64 copy and masks) to about 4-8 MiB whatever the layer size.
# 2^20 rather than 2^18: a quarter of the reduction calls, whose fixed cost dominated on CPU
# (resnet18, batch 32 at 224 px: statistics of every layer from 0.75x to 0.8x+ of a plain pass).
CHUNK_ELEMENTS = 1 << 20
# On an accelerator each reduction is a kernel launch and there is no cache to stay in: chunks
# of up to 2^24 values (64 MiB of sign() temporaries in float32) keep the launches per layer few.
ACCEL_CHUNK_ELEMENTS = 1 << 24

# Bounds on max|x|^2 * values per cell under which sums and sums of squares cannot overflow
# their accumulator (float32 for float32 and half outputs).
_SAFE_SUM = {"torch.float32": 1e38, "torch.float64": 1e307}

# Layers whose 3-D output is (N, tokens, dim): channels are the last dimension.
_TOKEN_TYPES = ("Linear", "LayerNorm", "Embedding", "MultiheadAttention", "RMSNorm", "MLP",
                "EncoderBlock", "TransformerEncoderLayer", "TransformerDecoderLayer")
# Element-wise layers inherit the channel dim of the layer before them.
_ELEMENTWISE = ("ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "LeakyReLU", "ELU", "Hardswish",
                "Hardsigmoid", "Mish", "Dropout", "Identity", "PReLU", "Softplus", "SELU", "CELU",
                "Softmax", "StochasticDepth", "AlphaDropout", "Hardtanh", "LogSoftmax")


def _reduce_nc(x: torch.Tensor, cdim: int, *, deferred: bool | None = None) -> tuple[torch.Tensor, ...]:
    """(N, C) float64 CPU tensors (count, mean, m2, min, max, zeros, negatives, nan, inf) and
    the cell size, of ``x`` with channels along ``cdim``, reduced chunk by chunk over channels.

    Finite floating values are read with reductions that allocate nothing of their size: sum
    and L2 norm (for the sum of squares), amin and amax; then the zero and negative counts come
    from min and max alone when no value of the chunk is zero, or from the sum of one sign()
    pass into a reused buffer: after a ReLU that sum counts the non-zeros; elsewhere the squared
    L2 norm of the same sign() values gives them (two reads, no second write). Half-precision values are
    reduced with a float32 accumulator, without a copy. Which of these a chunk takes is read
    from two numbers, its min and max: on the CPU at once, while the chunk is still in cache;
    on an accelerator (``deferred``; forced on any device by tests) every chunk's first
    reductions are queued and their min and max read back in one synchronisation. The raw
    sums become moments once per call, in numpy. Chunks holding NaN/Inf, or whose float32
    sums overflow, take the exact float64 path (:func:`_reduce_exact`).
    """
    import torch

    xm = x.movedim(cdim, 1) if cdim != 1 else x  # a view: no copy
    if xm.ndim == 2:
        xm = xm.unsqueeze(-1)
    n, c = xm.shape[0], xm.shape[1]
    cell = 1
    for d in xm.shape[2:]:
        cell *= int(d)
    dims = tuple(range(2, xm.ndim))
    limit = CHUNK_ELEMENTS if xm.device.type == "cpu" else ACCEL_CHUNK_ELEMENTS
    step = max(1, limit // max(1, n * cell))
    if deferred is None:
        deferred = xm.device.type != "cpu"

    def chunk(c0: int) -> torch.Tensor:
        xc = xm.narrow(1, c0, min(step, c - c0))
        return xc if xc.is_floating_point() else xc.to(torch.float64)  # integers: a chunk copy

    buf: list[torch.Tensor] = []  # the sign() buffer, shared by the chunks

    def sums(xc: torch.Tensor, first: tuple[torch.Tensor, ...], lo: float, hi: float) -> tuple[Any, ...] | None:
        s1, norm, mn, mx = first
        acc = s1.dtype
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None  # NaN or Inf in this chunk
        big = max(-lo, hi)
        if big * big * cell >= _SAFE_SUM[str(acc)] and not bool(torch.isfinite(s1).all() & torch.isfinite(norm).all()):
            return None  # the float32 sums overflowed
        return (s1, norm, mn, mx, *_counts(xc, dims, cell, lo, hi, buf))

    starts = list(range(0, c, step))
    raw: list[tuple[Any, ...] | None] = []
    if not deferred:  # reading two numbers costs nothing here: each chunk finished while in cache
        for c0 in starts:
            xc = chunk(c0)
            first = _first_sums(xc, dims)
            raw.append(sums(xc, first, first[2].min().item(), first[3].max().item()))
    else:
        firsts = [_first_sums(chunk(c0), dims) for c0 in starts]
        bounds = torch.stack([torch.stack([f[2].min(), f[3].max()]) for f in firsts]).tolist()
        raw = [sums(chunk(c0), first, lo, hi) for c0, first, (lo, hi) in zip(starts, firsts, bounds)]
    f64 = torch.float64
    if all(r is not None for r in raw):  # the common case: one copy back, one numpy pass
        stacked = torch.stack([torch.cat([r[i] for r in raw], dim=1).to(f64) for i in range(6)])
        out = _moments_of_sums(cell, *stacked.cpu().numpy())
    else:
        parts = []
        for c0, r in zip(starts, raw):
            if r is None:
                parts.append(tuple(t.cpu() for t in _reduce_exact(chunk(c0), dims, cell)))
            else:
                arrays = torch.stack([t.to(f64) for t in r[:6]]).cpu().numpy()
                parts.append(_moments_of_sums(cell, *arrays))
        out = tuple(torch.cat([p[i] for p in parts], dim=1) for i in range(9))
    return out + (torch.tensor(float(cell), dtype=f64),)


def _first_sums(xc: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Sum, L2 norm, min and max per (N, c) cell; float32 accumulators for float32 and half."""
    import torch

    acc = torch.float64 if xc.dtype == torch.float64 else torch.float32
    return (xc.sum(dims, dtype=acc), torch.linalg.vector_norm(xc, 2, dims, dtype=acc), xc.amin(dims), xc.amax(dims))


def _counts(xc: torch.Tensor, dims: tuple[int, ...], cell: int, lo: float, hi: float,
            buf: list[torch.Tensor]) -> tuple[Any, Any]:
    """(signed, nonzero) of a finite chunk whose min is ``lo`` and max ``hi``: per cell the
    sum of sign() (positives - negatives) and the number of non-zero values."""
    import torch

    # Counts accumulate exactly in float32 up to 2^24 per cell; beyond, in float64.
    acc = torch.float64 if xc.dtype == torch.float64 or cell > 1 << 24 else torch.float32
    if lo > 0 or hi < 0:  # no value is zero: counts from min/max alone
        signed = torch.full(xc.shape[:2], float(cell) if lo > 0 else -float(cell), dtype=acc, device=xc.device)
        return signed, torch.full_like(signed, float(cell))
    if not buf or buf[0].dtype != xc.dtype or buf[0].numel() < xc.numel():
        buf[:] = [torch.empty(xc.numel(), dtype=xc.dtype, device=xc.device)]
    sg = torch.sign(xc, out=buf[0][:xc.numel()].view(xc.shape))
    if lo >= 0:  # after a ReLU sign() is 0 or 1: its sum counts the non-zeros
        signed = sg.sum(dims, dtype=acc)
        return signed, signed
    # positives - negatives, and positives + negatives as the squared L2 norm of sign(): two
    # reads at the speed of a plain reduction, nothing written (issue 40; the norm of values
    # in {-1, 0, 1} is sqrt of an exact integer count, squared and rounded back to it).
    nonzero = torch.linalg.vector_norm(sg, 2, dims, dtype=acc).double().square_().round_()
    return sg.sum(dims, dtype=acc), nonzero


def _moments_of_sums(cell: int, s1: np.ndarray, norm: np.ndarray, mn: np.ndarray, mx: np.ndarray,
                     signed: np.ndarray, nonzero: np.ndarray) -> tuple[torch.Tensor, ...]:
    """The 9 (N, C) float64 tensors of :func:`_reduce_nc` from finite cells' sums: sum, L2
    norm, min, max, sum of sign() and number of non-zero values. The arrays are small: numpy
    costs less than torch calls."""
    import numpy as np
    import torch

    mean = s1 / cell
    # M2 = sum(x^2) - n mean^2; a constant cell has exactly 0 (no rounding residue).
    m2 = np.maximum(np.square(norm) - cell * np.square(mean), 0.0)
    m2[mn == mx] = 0.0
    cnt = np.full_like(s1, float(cell))
    none = np.zeros_like(s1)
    out = (cnt, mean, m2, mn, mx, cnt - nonzero, (nonzero - signed) / 2, none, none)
    return tuple(torch.from_numpy(a) for a in out)


def _reduce_exact(xc: torch.Tensor, dims: tuple[int, ...], cell: int) -> tuple[torch.Tensor, ...]:
    """Moments of a chunk holding NaN/Inf: a float64 copy, moments over finite values."""
    import torch

    xd = xc.to(torch.float64)
    bshape = (xd.shape[0], -1) + (1,) * len(dims)
    fin = torch.isfinite(xd)
    nan = torch.isnan(xd).sum(dims).to(torch.float64)
    cnt = fin.sum(dims).to(torch.float64)
    inf = float(cell) - cnt - nan
    mean = torch.where(fin, xd, 0.0).sum(dims) / cnt.clamp(min=1.0)
    m2 = torch.where(fin, xd - mean.view(bshape), 0.0).square_().sum(dims)
    mn = torch.where(fin, xd, math.inf).amin(dims)
    mx = torch.where(fin, xd, -math.inf).amax(dims)
    zeros = (xd == 0).sum(dims).to(torch.float64)
    neg = (fin & (xd < 0)).sum(dims).to(torch.float64)  # -inf counts under inf, as in tensor_stats
    return (cnt, mean, m2, mn, mx, zeros, neg, nan, inf)


def _sample_moments(r: tuple[torch.Tensor, ...]) -> list[Moments]:
    """Merge the (N, C) cells of :func:`_reduce_nc` over channels: one :class:`Moments` per
    sample (vectorised Chan update, in numpy: the arrays are small)."""
    import numpy as np

    cnt, mean, m2, mn, mx, zeros, neg, nan, inf = (t.numpy() for t in r[:9])
    cell = float(r[9])
    n_s = cnt.sum(1)
    mean_s = (cnt * mean).sum(1) / np.maximum(n_s, 1.0)
    m2_s = m2.sum(1) + (cnt * np.square(mean - mean_s[:, None])).sum(1)
    numel = int(cell * cnt.shape[1])
    rows = np.stack([n_s, mean_s, m2_s, mn.min(1), mx.max(1), zeros.sum(1), neg.sum(1),
                     nan.sum(1), inf.sum(1)], axis=1).tolist()
    return [Moments(numel=numel, count=int(n), mean=mu if n else 0.0, m2=v if n else 0.0,
                    min=lo, max=hi, zeros=int(z), negatives=int(ng), nan=int(na), inf=int(nf))
            for n, mu, v, lo, hi, z, ng, na, nf in rows]


def _channels(r: tuple[torch.Tensor, ...], dim: int) -> tuple[Channels, list[float]]:
    import torch

    cnt, mean, zeros = r[0].numpy(), r[1].numpy(), r[5].numpy()
    dead_nc = zeros == float(r[9])  # (N, C): every value of the channel exactly zero in that sample
    counts = cnt.sum(0)
    # One number for the counts while every value is finite: report memory is per channel.
    uniform = bool((counts == counts[0]).all()) if counts.size else True
    ch = Channels(dim=dim, sums=torch.from_numpy((cnt * mean).sum(0)),
                  counts=float(counts[0]) if uniform and counts.size else torch.from_numpy(counts),
                  dead=torch.from_numpy(dead_nc.all(0)))
    return ch, dead_nc.mean(1).tolist()


def measure(t: torch.Tensor, batch_size: int | None = None, *, hist_bins: int = 0,
            after_relu: Any = None, defer: bool = False) -> Measurement:
    """Measure one output tensor: per-sample moments and per-channel sums (see the docstring of
    :mod:`inspect_model.methods.activations.capture`).

    ``batch_size`` tells which leading dimension is the batch; when dim 0 differs, the whole
    tensor counts as one unit (``per_sample=False``). Floating tensors take the few-pass path
    of :mod:`~inspect_model.methods.activations.fused` (``after_relu``: the bounds of the
    tensor that ``t`` is the in-place ReLU of), others and non-finite ones the chunked one.
    ``defer`` (an accelerator, no histogram): where it applies, a
    :class:`~inspect_model.methods.activations.deferred.Pending` whose numbers come back with
    the batch's (deferred.py).
    """
    import torch

    from inspect_model.methods.activations.fused import measure_fused
    from inspect_model.methods.activations.native import CellBounds, measure_native

    x = t.detach()
    if x.is_quantized:
        x = x.dequantize()
    if x.is_complex():
        x = x.abs()
    per_sample = batch_size is not None and x.ndim >= 1 and x.shape[0] == batch_size
    # Candidate channel dims, in the coordinates of ``t``; 3-D outputs get both (see activations.py).
    if per_sample:
        cands = [] if x.ndim <= 1 else ([1, 2] if x.ndim == 3 else [1])
        shift = 0
    else:
        cands = [0] if x.ndim >= 1 else []
        shift = 1
        x = x.unsqueeze(0)  # one unit: the whole tensor
    if x.numel() == 0:
        return Measurement(per_sample, [Moments() for _ in range(x.shape[0])], {}, {})
    channels: dict[int, Channels] = {}
    sample_dead: dict[int, list[float]] = {}
    samples: list[Moments] | None = None
    bounds = None
    if defer and not hist_bins:
        from inspect_model.methods.activations.deferred import measure_deferred

        pending = measure_deferred(x, [(c, c + shift) for c in cands], per_sample)
        if pending is not None:
            return pending  # type: ignore[return-value]
    pairs = [(c, c + shift) for c in cands]
    fused = measure_native(x, pairs)  # float32 on the CPU: one read
    if fused is None:  # a native CellBounds' arrays are reused buffers: read again from x
        fused = measure_fused(x, pairs, after_relu=None if isinstance(after_relu, CellBounds) else after_relu)
    if fused is not None:
        samples, channels, sample_dead, bounds = fused
        cands = []
    for cdim in cands or ([None] if samples is None else []):
        r = _reduce_nc(x.reshape(x.shape[0], 1, -1), 1) if cdim is None else _reduce_nc(x, cdim + shift)
        if samples is None:
            samples = _sample_moments(r)
        if cdim is not None:
            channels[cdim], sample_dead[cdim] = _channels(r, cdim)
    assert samples is not None
    hist = None
    if hist_bins > 0:
        total = Moments()
        for s in samples:
            total.merge(s)
        if total.count:
            flat = x.reshape(-1)
            if total.count != total.numel:
                flat = flat[torch.isfinite(flat)]
            lo, hi = total.min, total.max
            if hi <= lo:
                hi = lo + 1e-6 if lo == 0 else lo + abs(lo) * 1e-6
            counts = torch.histc(flat.float(), bins=hist_bins, min=lo, max=hi)
            hist = (lo, hi, counts.cpu().tolist())
    return Measurement(per_sample, samples, channels, sample_dead, hist, bounds)


def choose_channel_dim(type_name: str, shape: Sequence[int], per_sample: bool,
                       previous: tuple[tuple[int, ...], int | None] | None) -> int | None:
    """Channel dimension of an output of ``shape`` (see the docstring of
    :mod:`inspect_model.methods.activations.capture`); ``previous`` is
    the shape and channel dim of the row just before it in the forward pass."""
    if not per_sample:
        return 0 if len(shape) >= 1 else None
    if len(shape) <= 1:
        return None
    if len(shape) != 3:
        return 1
    if type_name.endswith("1d"):
        return 1
    if type_name in _ELEMENTWISE and previous is not None and tuple(previous[0]) == tuple(shape):
        return previous[1]
    return 2
