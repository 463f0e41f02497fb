"""Layer statistics on an accelerator with no synchronisation per layer (issue 40).

On a GPU the per-layer measurement of :mod:`~inspect_model.methods.activations.fused` reads
a few numbers back in every hook; each read drains the device's queue, so the host's work
for the next layer and the device's work never overlap (resnet50, batch 64 on an H100: the
statistics of every leaf took 15x the plain forward, 33x before issue 40). Here the hook only
queues its reductions and keeps their small results on the device (:class:`Pending`); the
batch's results come back in one copy when the forward pass is over (:func:`resolve`).

What is queued per output, every reduction without a write of its size except one sign():
per image min, max and L2 norm over the image as one row; per (image, channel) cell the sum
of the values, and the sum and the L2 norm of their sign() values (positives - negatives
and the square root of positives + negatives: exact integer counts). A cell with no non-zero
value is a dead channel in that image, with no check value by value.

A batch whose values hold NaN or Inf, whose float32 sums overflow, or whose variance would
cancel (an image far from zero against its spread, see fused.py) cannot be finished from
these numbers: :func:`resolve` says so and the caller runs that batch again with the
measurement that reads numbers in the hook (``ActivationCapture.run``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from inspect_model.methods.activations.measure import Measurement

# Values per sign() temporary: whole images, at least one (64 MiB in float32).
CHUNK_ELEMENTS = 1 << 24
# Cells whose count read back from the L2 norm of sign() values rounds exactly (see fused.py).
_CELL_LIMIT = 1 << 21
_FLOATS = ("torch.float32", "torch.float16", "torch.bfloat16")


@dataclass
class Pending:
    """A measurement whose numbers are still on the device: per image (N,) min, max and L2
    norm; per candidate channel dim (N, C) cell sums, sign() sums and sign() L2 norms."""

    per_sample: bool
    numel: int  # values per image
    cands: list[int]  # channel dims (keys of Measurement.channels)
    parts: list[torch.Tensor] = field(default_factory=list)  # float32, in the order above
    bounds: Any = None  # never derived from (the ReLU shortcut needs numbers now)


def defer_on(device: torch.device) -> bool:
    """Whether outputs on ``device`` are measured deferred (accelerators; tests force it)."""
    return device.type != "cpu"


def measure_deferred(x: torch.Tensor, cands: list[tuple[int, int]], per_sample: bool) -> Pending | None:
    """Queue the reductions of ``x`` (N, ...), images along dim 0; ``cands``: (key, dim of x)
    of each candidate channel dim. ``None`` where this path does not apply (another dtype, a
    strided tensor, no channel dim, cells too large for exact counts)."""
    import torch

    if str(x.dtype) not in _FLOATS or not cands or x.numel() == 0 or not x.is_contiguous():
        return None
    n = int(x.shape[0])
    if any(x.numel() // max(1, n * int(x.shape[d])) > _CELL_LIMIT for _, d in cands):
        return None
    f32 = torch.float32
    flat = x.view(n, -1)
    p = Pending(per_sample, int(flat.shape[1]), [k for k, _ in cands])
    p.parts += [flat.amin(1).to(f32), flat.amax(1).to(f32), torch.linalg.vector_norm(flat, 2, 1, dtype=f32)]
    step = max(1, CHUNK_ELEMENTS // max(1, int(flat.shape[1])))
    signs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {k: [] for k, _ in cands}
    for i0 in range(0, n, step):  # sign() of a few whole images at a time
        sg = torch.sign(x[i0:i0 + step])
        for key, dim in cands:
            rest = _rest(x.ndim, dim)
            if rest:
                signs[key].append((sg.sum(rest, dtype=f32), torch.linalg.vector_norm(sg, 2, rest, dtype=f32)))
            else:  # (N, C) outputs: each cell one value (an empty dim list would reduce them all)
                signs[key].append((sg.to(f32), sg.abs().to(f32)))
    for key, dim in cands:
        rest = _rest(x.ndim, dim)
        p.parts.append(x.sum(rest, dtype=f32) if rest else x.to(f32, copy=True))
        p.parts += [torch.cat([s for s, _ in signs[key]]), torch.cat([q for _, q in signs[key]])]
    return p


def _rest(ndim: int, dim: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, ndim) if d != dim)


def resolve(pending: list[Pending]) -> list[Measurement] | None:
    """The measurements of ``pending``, from one copy to the host; ``None`` when one of them
    cannot be finished from its numbers (module docstring)."""
    import numpy as np
    import torch

    if not pending:
        return []
    tensors = [t for p in pending for t in p.parts]
    values = torch.cat([t.reshape(-1) for t in tensors]).cpu().numpy().astype(np.float64)
    if not np.isfinite(values).all():
        return None
    out, at = [], 0
    for p in pending:
        arrays = []
        for t in p.parts:
            arrays.append(values[at:at + t.numel()].reshape(tuple(t.shape)))
            at += t.numel()
        m = _finish(p, arrays)
        if m is None:
            return None
        out.append(m)
    return out


def _finish(p: Pending, a: list[Any]) -> Measurement | None:
    import numpy as np
    import torch

    from inspect_model.methods.activations.fused import Bounds
    from inspect_model.methods.activations.measure import Channels, Measurement, Moments

    lo, hi, norm = a[0], a[1], a[2]
    sums, signed, roots = a[3], a[4], a[5]  # the first channel dim's cells
    n, m = len(lo), p.numel
    nonzero_cells = np.round(np.square(roots))
    nonzero, s1, sumsq = nonzero_cells.sum(1), sums.sum(1), np.square(norm)
    b = Bounds(lo, hi, m - nonzero, (nonzero - signed.sum(1)) / 2)
    mean = s1 / m
    m2 = np.maximum(sumsq - m * np.square(mean), 0.0)
    m2[lo == hi] = 0.0
    if ((lo < hi) & (m2 * 1e3 < sumsq)).any():
        return None  # the variance cancels: read the values again (fused.py)
    samples = [Moments(numel=m, count=m, mean=float(mean[i]), m2=float(m2[i]), min=float(lo[i]), max=float(hi[i]),
                       zeros=int(b.zeros[i]), negatives=int(b.negatives[i])) for i in range(n)]
    channels, dead_fraction = {}, {}
    for j, key in enumerate(p.cands):
        cs, roots_j = a[3 + 3 * j], a[5 + 3 * j]
        dead = np.round(np.square(roots_j)) == 0  # (N, C): no non-zero value in the cell
        cell = m // max(1, cs.shape[1])
        channels[key] = Channels(dim=key, sums=torch.from_numpy(cs.sum(0)), counts=float(n * cell),
                                 dead=torch.from_numpy(dead.all(0)))
        dead_fraction[key] = dead.mean(1).tolist()
    return Measurement(p.per_sample, samples, channels, dead_fraction, None, None)
