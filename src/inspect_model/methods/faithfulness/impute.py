"""ROAD's noisy linear imputation (Rong et al. 2022), solved by multigrid-preconditioned
conjugate gradients.

Each removed pixel becomes the weighted mean of its in-image neighbours (edges 1/6, corners
1/12), removed or not: per (mask, channel) the sparse system (D - W_uu) u = W_uk x_k, symmetric
positive definite whenever one pixel is kept. Large smooth removed regions make it badly
conditioned (plain CG needs hundreds of iterations at 224 px), so CG is preconditioned by one
V-cycle of geometric multigrid:

- prolongation P: bilinear interpolation from every second pixel (the last one
  replicated past the border), restriction its transpose; on the finest level P only writes removed pixels;
- coarse operators: Galerkin products P^T A P, 9-point stencils formed directly from the
  finer stencil (:mod:`.multigrid`); they depend on the mask only, so they are built once per
  mask and shared by its channels;
- smoothing: one damped Jacobi step before and after the coarse correction (the symmetric
  V(1,1) cycle; on coarse levels damped further where a row's couplings outweigh its
  diagonal, so the cycle is positive definite for any mask and PCG's theory holds);
  coarsest level (<= 200 points): dense Cholesky.

All masks and channels are solved as one batch (B, C, H, W) on an accelerator, and on a CPU
in groups of masks whose vectors stay in cache (2^19 values: 3 masks of 3 x 224 x 224); the
work is a few dozen stencil applications of the batch. Converges in 5-7 iterations to a
relative residual of 1e-5 for ROAD's masks at 64-224 px (checked against scipy's exact solve in
benchmarks/bench_evaluate.py and against a dense solve in tests/cli/test_faithfulness.py).

float32 on a CPU: the fine operator, its residual and smoothing step, the coarse stencils,
the transfers and the Galerkin products run as native loops (:mod:`.native`, one pass each
in place of up to nine torch ops; the same floats as the torch path, which runs without a
compiler or with ``INSPECT_MODEL_NATIVE=0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from inspect_model.methods.faithfulness import native
from inspect_model.methods.faithfulness.multigrid import (  # noqa: F401  (re-exported: the solver's parts)
    CORNER,
    EDGE,
    OFFSETS,
    Level,
    apply_stencil,
    box,
    galerkin,
    hierarchy,
    neighbours,
    prolong,
    restrict,
)


if TYPE_CHECKING:
    import torch

SMOOTH_FINE = 1.0  # Jacobi damping on the fine 9-point operator (smoothing factor 1/3)
CPU_GROUP_ELEMENTS = 1 << 19  # values of one vector of a CPU solve (masks x channels x pixels): 2 MiB


def impute(x: torch.Tensor, remove: torch.Tensor, *, noise: float = 0.0, generator: torch.Generator | None = None,
           tol: float = 1e-5, max_iter: int | None = None) -> torch.Tensor:
    """Noisy linear imputation: removed pixels become the weighted mean of their in-image
    neighbours (removed or not), solved jointly, then ``noise`` * N(0, 1) is added to them.

    x (C, H, W) or (B, C, H, W); remove (B, H, W) bool -> (B, C, H, W). ``tol``: relative
    residual at which each (mask, channel) system stops; ``max_iter``: PCG iterations at most
    (default 100). A mask that removes every pixel leaves nothing to interpolate from: its
    pixels become 0 (plus noise)."""
    import torch

    b_, h, w = remove.shape
    if x.dim() == 3:
        x = x[None].expand(b_, -1, -1, -1)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.to(work)
    c = xs.shape[1]
    m = remove[:, None].to(device=xs.device, dtype=work)  # (B, 1, H, W) 1 = unknown
    known = xs * (1 - m)
    # On a CPU one torch thread per op: the solve is a few hundred small memory-bound ops,
    # which threads barely speed up on an idle machine, and on a busy one each op's barrier
    # waits for a descheduled thread (measured on 2 loaded cores: 224 px, 18 masks, 40 s with
    # 2 threads, 5 s with one). The cores are used by solving groups side by side instead.
    threads = torch.get_num_threads()
    single = xs.device.type == "cpu" and threads > 1
    if single:
        torch.set_num_threads(1)
    # On a CPU, masks in groups whose vectors stay in cache (issue 40): PCG's two dozen
    # passes per iteration over 18 masks x 3 channels at 224 px (11 MB a vector) ran from
    # memory; in groups of 3 masks the same solve took 25% less CPU time. Each group stops
    # when its own systems reach ``tol`` (one batch stops when all 18 do; both within tol).
    group = b_ if xs.device.type != "cpu" else max(1, CPU_GROUP_ELEMENTS // max(1, c * h * w))
    starts = range(0, b_, group)

    def solve(i: int) -> torch.Tensor:
        with torch.no_grad():
            return pcg(known[i:i + group], m[i:i + group], tol=tol, max_iter=max_iter or 100)[0]

    try:
        if single and len(starts) > 1:
            # The other cores: groups on as many Python threads as torch had threads, each op
            # on one thread (no barrier to wait on when the machine is busy), the same numbers.
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(min(threads, len(starts)), thread_name_prefix="inspect-model-impute")
            try:
                u = torch.cat(list(pool.map(solve, starts)))
            finally:  # a signal or an error: the groups not started are dropped, not waited for
                pool.shutdown(wait=True, cancel_futures=True)
        else:
            u = torch.cat([solve(i) for i in starts])
        out = known + u
    finally:
        if single:
            torch.set_num_threads(threads)
    if noise:
        eps = torch.randn((b_, c, h, w), generator=generator, dtype=work).to(xs.device)
        out = out + m * noise * eps
    return out.to(x.dtype)


def pcg(known: torch.Tensor, m: torch.Tensor, *, tol: float, max_iter: int) -> tuple[torch.Tensor, int]:
    """The removed pixels' values (0 elsewhere) and the iterations run. known (B, C, H, W),
    0 at removed pixels; m (B, 1, H, W), 1 at removed pixels."""
    import torch

    b, c, h, w = known.shape
    known, m = known.contiguous(), m.contiguous()  # the native passes read NCHW (channels_last: a copy)
    d = neighbours(torch.ones(1, 1, h, w, dtype=known.dtype, device=known.device))  # in-image weight
    rhs = m * neighbours(known)
    levels, chol = hierarchy(m, d)
    fine_dinv = m * (SMOOTH_FINE / d)
    # The fine operator m (d v - neighbours(v)) for v = 0 at kept pixels, as
    # centre * v - m / 12 * box(v): neighbours(v) = (box(v) - 4 v) / 12.
    centre, edge = m * (d + 1 / 3), m * (1 / 12)

    def residual(r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # r - A v
        return torch.addcmul(r, centre, v, value=-1).addcmul_(edge, box(v))

    def op(v: torch.Tensor) -> torch.Tensor:
        return torch.mul(centre, v).addcmul_(edge, box(v), value=-1)

    def direct(r: torch.Tensor) -> torch.Tensor:  # the coarsest level: dense Cholesky
        z = torch.cholesky_solve(r.reshape(r.shape[0], r.shape[1], -1).transpose(1, 2).double(), chol)
        return z.transpose(1, 2).reshape(r.shape).to(r.dtype)

    def cycle(j: int, r: torch.Tensor) -> torch.Tensor:  # V(1,1) from coarse level j (the last: direct)
        if j == len(levels) - 1:
            return direct(r)
        lv = levels[j]
        x = lv.dinv * r  # pre-smoothing from 0
        x += prolong(cycle(j + 1, restrict(r - apply_stencil(lv.stencil, x), levels[j + 1].hw)), lv.hw)
        return x.addcmul_(lv.dinv, r - apply_stencil(lv.stencil, x))  # post-smoothing

    def vcycle(r: torch.Tensor) -> torch.Tensor:  # the preconditioner: one V(1,1) cycle
        if not levels:
            return direct(r)
        x = fine_dinv * r
        x.addcmul_(m, prolong(cycle(0, restrict(residual(r, x), levels[0].hw)), (h, w)))
        return x.addcmul_(fine_dinv, residual(r, x))

    lib = native.usable(known)
    if lib is not None:  # the same passes, each one native loop (issue 40)
        op, vcycle = _native_cycle(native.Passes(lib, centre, edge), levels, direct, fine_dinv, m)

    def dot(a: torch.Tensor, bb: torch.Tensor) -> torch.Tensor:  # (B, C, 1, 1)
        a, bb = a.reshape(b * c, h * w), bb.reshape(b * c, h * w)
        if a.device.type != "cpu":
            return torch.linalg.vecdot(a, bb).reshape(b, c, 1, 1)
        # one BLAS dot per system: on a CPU faster than vecdot (a product, then a sum) or bmm
        return torch.stack([torch.dot(a[i], bb[i]) for i in range(b * c)]).reshape(b, c, 1, 1)

    u = torch.zeros_like(known)
    r = rhs.clone()
    z = vcycle(r)
    p = z
    rz = dot(r, z)
    bound = (tol * rhs.norm(dim=(2, 3), keepdim=True)) ** 2 + 1e-30
    it = 0
    for it in range(max_iter + 1):
        if it == max_iter or bool((dot(r, r) <= bound).all()):
            break
        ap = op(p)
        denom = dot(p, ap)
        alpha = torch.where(denom > 0, rz / denom.clamp_min(1e-30), torch.zeros_like(rz))
        u.addcmul_(alpha, p)
        r.addcmul_(alpha, ap, value=-1)
        z = vcycle(r)
        rz_new = dot(r, z)
        p = z.addcmul_(rz_new / rz.clamp_min(1e-30), p)  # z is not read again: in place (no fresh pages)
        rz = rz_new
    return u, it


def _native_cycle(ps: native.Passes, levels: list[Level], direct: Callable[[torch.Tensor], torch.Tensor],
                  fine_dinv: torch.Tensor, m: torch.Tensor) -> tuple[Callable[..., torch.Tensor], ...]:
    """:func:`pcg`'s fine operator and V(1,1) cycle with native passes: the same floats."""

    def cycle(j: int, r: torch.Tensor) -> torch.Tensor:
        if j == len(levels) - 1:
            return direct(r)
        lv = levels[j]
        x = lv.dinv * r
        ps.prolong_add(cycle(j + 1, ps.restrict(ps.stencil(lv.stencil, x, r), levels[j + 1].hw)), x)
        return ps.stencil(lv.stencil, x, r, lv.dinv)

    def vcycle(r: torch.Tensor) -> torch.Tensor:
        if not levels:
            return direct(r)
        x = fine_dinv * r
        ps.prolong_add(cycle(0, ps.restrict(ps.fine(x, r), levels[0].hw)), x, m)
        return ps.fine(x, r, fine_dinv)

    return ps.fine, vcycle
