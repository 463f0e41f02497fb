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
value is a dead channel in that image, with no check value by value. The (N, C) cells are
reduced on the device: (N,) and (C,) numbers come back, not the cells (resnet50, batch 64:
the cells' copy alone took 42 ms, 4x the forward pass).

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

    from inspect_model.methods.activations.moments import Measurement

# Values per sign() temporary: whole images, at least one (64 MiB in float32).
CHUNK_ELEMENTS = 1 << 24
# Cells whose count read back from the L2 norm of sign() values rounds exactly (see fused.py).
_CELL_LIMIT = 1 << 21
_FLOATS = ("torch.float32", "torch.float16", "torch.bfloat16")


@dataclass
class Pending:
    """A measurement whose numbers are still on the device, float64: per image (N,) min, max,
    L2 norm, sum, sign() sum and non-zero count; per candidate channel dim the channel sums
    (C,), dead channels (C,, 1.0 or 0.0) and each image's dead fraction (N,)."""

    per_sample: bool
    numel: int  # values per image
    cands: list[int]  # channel dims (keys of Measurement.channels)
    parts: list[torch.Tensor] = field(default_factory=list)  # in the order above
    bounds: Any = None  # never derived from (the ReLU shortcut needs numbers now)


def defer_on(device: torch.device) -> bool:
    """Whether outputs on ``device`` are measured deferred: CUDA devices (float64 reductions
    of the small results; MPS has no float64); tests force it on the CPU."""
    return device.type == "cuda"


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
    f64 = torch.float64
    p.parts = [t.to(f64) for t in p.parts]
    for j, (key, dim) in enumerate(cands):  # reduced here: (N,) and (C,) numbers go back, not (N, C)
        rest = _rest(x.ndim, dim)
        cells = (x.sum(rest, dtype=f32) if rest else x.to(f32)).to(f64)  # (N, C)
        signed, roots = torch.cat([s for s, _ in signs[key]]), torch.cat([q for _, q in signs[key]])
        if j == 0:  # per image: sum, positives - negatives, positives + negatives (exact integers)
            p.parts += [cells.sum(1), signed.to(f64).sum(1), roots.to(f64).square().round().sum(1)]
        dead = roots == 0  # (N, C): no non-zero value in the cell
        p.parts += [cells.sum(0), dead.all(0).to(f64), dead.to(f64).mean(1)]
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
    flat = [t.reshape(-1) for p in pending for t in p.parts]
    if len({t.device for t in flat}) == 1:
        values = torch.cat(flat).cpu().numpy()
    else:  # a model spread over devices: one copy per tensor
        values = torch.cat([t.cpu() for t in flat]).numpy()
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

    from inspect_model.methods.activations.moments import Channels, Measurement, Moments

    lo, hi, norm, s1, signed, nonzero = a[:6]
    n, m = len(lo), p.numel
    zeros, negatives = m - nonzero, (nonzero - signed) / 2
    sumsq = np.square(norm)
    mean = s1 / m
    m2 = np.maximum(sumsq - m * np.square(mean), 0.0)
    m2[lo == hi] = 0.0
    if ((lo < hi) & (m2 * 1e3 < sumsq)).any():
        return None  # the variance cancels: read the values again (fused.py)
    samples = [Moments(numel=m, count=m, mean=float(mean[i]), m2=float(m2[i]), min=float(lo[i]), max=float(hi[i]),
                       zeros=int(zeros[i]), negatives=int(negatives[i])) for i in range(n)]
    channels, dead_fraction = {}, {}
    for j, key in enumerate(p.cands):
        sums, dead, fraction = a[6 + 3 * j:9 + 3 * j]
        channels[key] = Channels(dim=key, sums=torch.from_numpy(sums.copy()), counts=float(n * (m // max(1, len(sums)))),
                                 dead=torch.from_numpy(dead > 0))
        dead_fraction[key] = fraction.tolist()
    return Measurement(p.per_sample, samples, channels, dead_fraction, None, None)


def resolve_records(records: list[Any]) -> bool:
    """Replace the deferred measurements of ``records`` by their numbers, read back in one
    copy; False when a batch must be measured again (deferred.py). An output measured once
    and recorded twice (Identity) gets its own channel accumulators."""
    from dataclasses import replace

    caps = [c for r in records for c in r.outputs if isinstance(c.stats, Pending)]
    unique = list({id(c.stats): c.stats for c in caps}.values())
    done = resolve(unique)
    if done is None:
        return False
    by_id = {id(p): m for p, m in zip(unique, done)}
    seen: set[int] = set()
    for c in caps:
        m = by_id[id(c.stats)]
        c.stats = m if id(m) not in seen else replace(m, channels={k: ch.copy() for k, ch in m.channels.items()})
        seen.add(id(m))
    return True
