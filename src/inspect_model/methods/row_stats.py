"""Gradient statistics at memory speed for ``grads`` (issue 40): each gradient measured once
(:class:`SeenGradients`), norms without float64 copies (:func:`l2_norm`); the row reductions
themselves are :func:`inspect_model.methods.stats.fast_stats`, which ``tensor_stats`` uses.

Profiling ``grads`` on resnet18/resnet50 (batch 8, 224 px) showed where its 1.9-3x over one
forward + backward went: not in hooks or Python, but in the statistics' reductions with a
float64 accumulator (``x.sum(dtype=float64)``, ``vector_norm(..., dtype=float64)``: on the
CPU each converts every value in a scalar loop, 40-50 ms for 6.4M values against 0.3 ms for
the same reduction in float32 over rows) and in ``(x < 0).sum()`` (a bool -> int64 sum, 70 ms).

Here the values are cut into rows of a few thousand (whole samples' rows, so that per-sample
norms come out of the same pass); sum, L1 and L2 norm are reduced per row in float32 (rows
short enough for float32's rounding to stay near 1e-7 relative) and the rows are added up in
float64; min/max by one ``aminmax``, the zero and negative counts from the row sums and row
L2 norms of one ``sign()`` (``count_nonzero`` and ``(x < 0).sum()`` are 5-20x slower). Where
that could lose digits the exact path of :func:`inspect_model.methods.stats.tensor_stats`
runs instead: NaN or Inf, values whose squares leave float32's range, and a mean so large
next to the spread that the variance would come from a cancellation.

On the CPU all of it comes from one read of each value by ``im_rows_f32``, a loop of the
native kernel of ``activations`` (methods/activations/kernel.py: built and loaded there, run on
torch's OpenMP threads): sum, sums of squares and of |x| per row, unshifted, float32 over
blocks of 1,024 values added in double (within 1e-8 of float64 like torch's pairwise float32
reductions), min, max, zeros and negatives. resnet50 batch 8's layer-gradient statistics
took 530 -> 107 ms of process CPU on one thread (grads 1.30x -> 1.05x a forward + backward,
in place of ten torch passes per gradient). Without a compiler (or ``INSPECT_MODEL_NATIVE=0``)
torch's reductions above run (stats.py ``_torch_counts``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from inspect_model.methods.stats import FAST_MIN, TensorStats, _row_length, fast_stats, tensor_stats

if TYPE_CHECKING:
    import torch

__all__ = ["FAST_MIN", "SeenGradients", "fast_stats", "l2_norm"]


class SeenGradients:
    """The statistics of the last few gradients measured in a backward pass, found again by
    where their values lie. A layer's output gradient is, in a chain, the very memory the next
    layer's input gradient was (the engine's input aliases hand their gradient back as is):
    measuring it once halves the statistics of ``grads``. An entry holds a weak reference to
    the gradient tensor measured, nothing else: a strong one, or a Python object of its
    storage (``untyped_storage()``, kept alive with the storage), would stop autograd from
    adding a residual branch's gradient in place (it does so only into a buffer nobody else
    holds): 16 out-of-place additions of resnet50's gradients, 50 ms. A hit needs that tensor
    alive (so its memory is not reused: a tensor at the same address shares it), the same
    address, dtype and layout, and the same version (views share their base's version
    counter: an in-place addition since is a miss)."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._seen: dict[tuple, tuple[Any, int, TensorStats, list[float] | None]] = {}
        self._buf: list[torch.Tensor] = []  # fast_stats' scratch, reused within a pass

    def measure(self, g: torch.Tensor, n: int) -> tuple[TensorStats, list[float] | None]:
        """(statistics, per-sample L2 norms when dim 0 is the batch ``n``) of ``g``."""
        import weakref

        import torch

        passed, g = g, g.detach()  # the tensor autograd holds, weakly referenced below
        batch = g.dim() >= 1 and g.shape[0] == n
        strided = g.layout == torch.strided and g.numel() > 0
        # The same memory read in the same order: equal values (a flatten between two layers
        # changes the shape only; the per-sample norms hold where both lead with the batch).
        key = ((g.data_ptr(), g.dtype, g.numel()) if g.is_contiguous() else
               (g.data_ptr(), g.dtype, tuple(g.shape), g.stride())) if strided else None
        hit = self._seen.get(key) if strided else None
        if hit is not None and hit[0]() is not None and g._version == hit[1] and (not batch or hit[3] is not None):
            return hit[2], hit[3] if batch else None
        fast = fast_stats(g, n, self._buf)
        if fast is not None:
            stats, per = fast[0], fast[1] if batch else None
        else:
            stats = tensor_stats(g, exact=True)
            per = None
        if per is None and batch:
            per = torch.linalg.vector_norm(g.reshape(n, -1), dim=1, dtype=torch.float64).tolist()
        if strided:
            self._seen.pop(key, None)
            self._seen[key] = (weakref.ref(passed), g._version, stats, per)
            while len(self._seen) > self.size:
                self._seen.pop(next(iter(self._seen)))
        return stats, per

    def clear(self) -> None:
        self._seen.clear()
        self._buf.clear()


def l2_norm(t: torch.Tensor) -> float:
    """``float(t.double().norm())`` without the float64 copy for a large float32 tensor
    (row norms in float32, added in float64); the exact way where a row's norm might have
    left float32's range."""
    import torch

    x = t.detach()
    row = _row_length(x.numel()) if x.dtype == torch.float32 and x.numel() >= FAST_MIN else 0
    if row and x.layout == torch.strided:
        rn = torch.linalg.vector_norm(x.reshape(-1).view(-1, row), 2, 1).to(torch.float64)
        total = float(rn.square().sum().sqrt())
        if math.isfinite(total) and 1e-10 < total and float(rn.max()) < 1e18:
            return total
    return float(torch.linalg.vector_norm(x, dtype=torch.float64))
