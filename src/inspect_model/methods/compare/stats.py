"""The numbers of one matched pair of layer outputs, accumulated over calls and batches.

Side A is the reference: relative error ``‖a−b‖/‖a‖``, max ``|a−b|``, cosine similarity,
the share of elements beyond the tolerance (``|a−b| > tol + tol·|a|``, numpy's ``isclose``
with rtol = atol = tol), and for a reduced-precision side B the values of A that B's dtype
cannot hold: overflow (``|a|`` above the dtype's largest finite value) and underflow (non-zero
``|a|`` below its smallest normal). Sums are kept in float64, so a layer's numbers over several
batches are those of all its elements at once. Non-finite elements are counted, and left out
of the sums. A float32 CPU pair's numbers come from the native kernel of :mod:`.kernel`, in one
read of each side; anything else (another dtype or device, no compiler) from torch's ops in
cache-sized chunks (:meth:`PairSums._torch`), the same numbers to float32 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inspect_model.methods.compare.kernel import pair

_CHUNK = 1 << 18  # elements per chunk (1 MiB of float32): the fastest of 2**14 ... 2**20 and whole tensors, measured


class Scratch:
    """Buffers reused from chunk to chunk and pair to pair (one per run: freed with it), and
    whether the last pair was exactly equal (which path :meth:`PairSums._chunk` tries first)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, Any], Any] = {}
        self.views: dict[tuple[str, Any, int], Any] = {}
        self.sums: dict[tuple[Any, Any], list[Any]] = {}
        self.equal = True
        self.beyond = False  # whether the last differing pair had elements beyond the tolerance

    def results(self, like: Any) -> list[Any]:
        """Five 0-dim views (out= targets) of one 5-element tensor of ``like``'s dtype and device,
        and the tensor itself last."""
        import torch

        key = (like.dtype, like.device)
        r = self.sums.get(key)
        if r is None:
            t = torch.empty(5, dtype=like.dtype, device=like.device)
            r = self.sums[key] = [t[i] for i in range(5)] + [t]
        return r

    def get(self, role: str, n: int, like: Any) -> Any:
        """A buffer of ``n`` elements of ``like``'s dtype, on its device."""
        import torch

        key = (role, like.dtype, n)  # a view per size: most models have a few sizes, and a slice is a torch call
        view = self.views.get(key)
        if view is not None and view.device == like.device:
            return view
        full = self.buffers.get(key[:2])
        if full is None or full.numel() < n or full.device != like.device:
            full = self.buffers[key[:2]] = torch.empty(n, dtype=like.dtype, device=like.device)
            self.views = {k: v for k, v in self.views.items() if k[:2] != key[:2]}  # views of the old buffer
        view = self.views[key] = full[:n]
        return view


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

    def add(self, a: Any, b: Any, tolerance: float, low: Any = None, scratch: Scratch | None = None) -> None:
        """One call's pair: ``a`` (A's output) and ``b`` (B's), any dtype or device; ``low``:
        the reduced-precision dtype whose range is checked (None: none); ``scratch``: buffers
        reused from pair to pair (None: fresh ones)."""
        import torch

        self.calls += 1
        if b is None:
            self.missing += 1
            return
        if self.shape is None:
            self.shape = tuple(int(s) for s in a.shape)
        if a.shape != b.shape:
            self.other_shape = tuple(int(s) for s in b.shape)
            return
        work = torch.float64 if a.dtype == torch.float64 else torch.float32
        x = (a.detach() if a.requires_grad else a).reshape(-1)  # no grad in a compare: skip a call per side
        if x.dtype != work:
            x = x.to(work)
        y = (b.detach() if b.requires_grad else b).reshape(-1)
        if y.dtype != work or y.device != x.device:
            y = y.to(device=x.device, dtype=work)
        got = pair(x, y, tolerance, low)  # the native kernel: one read of each side, every number
        if got is not None:
            sq_d, sq_a, sq_b, mx, beyond, over, under = got
            self.overflow += int(over)
            self.underflow += int(under)
        else:
            if low is not None:
                self._range(x, low)
            sq_d, sq_a, sq_b, mx, beyond = self._torch(x, y, tolerance, scratch or Scratch())
        if not math.isfinite(sq_a + sq_b + sq_d + mx):  # a NaN/Inf (or a huge value): the careful path
            self._careful(x, y, tolerance)
            return
        self.elements += x.numel()
        self.sq_d += sq_d
        self.sq_a += sq_a
        self.sq_b += sq_b
        if mx > self.max_abs:
            self.max_abs = mx
        self.beyond += int(beyond)

    def _torch(self, x: Any, y: Any, tolerance: float, scratch: Scratch) -> tuple[float, float, float, float, int]:
        """(Σd², Σa², Σb², max|d|, beyond) by torch's ops (no native kernel)."""
        n = x.numel()
        if n <= _CHUNK:  # most layers: one chunk, no slices
            return self._chunk(x, y, tolerance, scratch)
        # Cache-sized chunks: each chunk's passes (difference, sums, extremes, share beyond) run
        # while it is in the CPU's cache, so each whole output is read from memory about once.
        parts = [self._chunk(x[i:i + _CHUNK], y[i:i + _CHUNK], tolerance, scratch) for i in range(0, n, _CHUNK)]
        return tuple(sum(p[k] for p in parts) if k != 3 else max(p[3] for p in parts)  # type: ignore[return-value]
                     for k in range(5))

    @staticmethod
    def _chunk(x: Any, y: Any, tolerance: float, scratch: Scratch) -> tuple[float, float, float, float, int]:
        """(Σd², Σa², Σb², max|d|, beyond) of one chunk, d = a − b. torch.equal is no shortcut
        (it is not vectorised: 7x a dot), an exact zero Σd² is (a NaN never equals itself).
        After an equal pair Σd² is read first (equal again: one dot more and done); after a
        differing one all four sums come in one read (Σ|d|² is Σd², bit for bit)."""
        import torch

        n = x.numel()
        if n == 0:
            return 0.0, 0.0, 0.0, 0.0, 0
        d = torch.sub(x, y, out=scratch.get("d", n, x))
        if scratch.equal:
            sq_d = float(torch.dot(d, d))
            if sq_d == 0.0:  # every element equal: nothing beyond, max 0
                sq = float(torch.dot(x, x))
                return 0.0, sq, sq, 0.0, 0
            scratch.equal = False
            d = d.abs_()  # amax, not aminmax or max(): 3x faster
            sq_a, sq_b, mx = torch.stack((torch.dot(x, x), torch.dot(y, y), d.amax())).tolist()
        else:
            d = d.abs_()
            r = scratch.results(x)  # five 0-dim views of one tensor: the sums land there, one read for all
            torch.dot(d, d, out=r[0])
            torch.dot(x, x, out=r[1])
            torch.dot(y, y, out=r[2])
            torch.amax(d, out=r[3])
            if scratch.beyond:  # the last pair had elements beyond: count now, read once (0 if max|d| <= tol)
                m = torch.abs(x, out=scratch.get("m", n, x))
                torch.sum(torch.sub(d, m, alpha=tolerance, out=m).gt_(tolerance), dim=0, out=r[4])
                sq_d, sq_a, sq_b, mx, beyond = r[5].tolist()
                if sq_d == 0.0:
                    scratch.equal = True
                    return 0.0, sq_a, sq_a, 0.0, 0
                scratch.beyond = mx > tolerance
                return sq_d, sq_a, sq_b, mx, int(beyond)
            sq_d, sq_a, sq_b, mx = r[5][:4].tolist()
            if sq_d == 0.0:
                scratch.equal = True
                return 0.0, sq_a, sq_a, 0.0, 0
        if not mx > tolerance:  # no element beyond tol + tol·|a| (>= tol); a NaN max: the careful path
            return sq_d, sq_a, sq_b, mx, 0
        scratch.beyond = True
        excess = torch.sub(d, torch.abs(x, out=scratch.get("m", n, x)), alpha=tolerance, out=d)  # |a−b| − tol·|a|
        # gt_ in place and a float sum: 8x faster than a bool tensor and count_nonzero (exact: < 2**24 ones)
        return sq_d, sq_a, sq_b, mx, int(excess.gt_(tolerance).sum())

    def _careful(self, x: Any, y: Any, tolerance: float) -> None:
        """A pair with non-finite elements: counted, and left out of the sums."""
        import torch

        ok_x, ok_y = torch.isfinite(x), torch.isfinite(y)
        self.nonfinite_a += int((~ok_x).sum())
        self.nonfinite_b += int((~ok_y).sum())
        keep = ok_x & ok_y
        x, y = x[keep], y[keep]
        d = x - y
        self.elements += int(x.numel())
        self.sq_d += float(torch.dot(d, d))
        self.sq_a += float(torch.dot(x, x))
        self.sq_b += float(torch.dot(y, y))
        d = d.abs_()
        mx = float(d.max()) if d.numel() else 0.0
        self.max_abs = max(self.max_abs, mx)
        if mx > tolerance:
            self.beyond += int(torch.count_nonzero(d.sub_(x.abs(), alpha=tolerance) > tolerance))

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
