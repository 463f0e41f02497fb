"""ROAD's noisy linear imputation (Rong et al. 2022), solved by multigrid-preconditioned
conjugate gradients.

Each removed pixel becomes the weighted mean of its in-image neighbours (edges 1/6, corners
1/12), removed or not: per (mask, channel) the sparse system (D - W_uu) u = W_uk x_k, symmetric
positive definite whenever one pixel is kept. Large smooth removed regions make it badly
conditioned (plain CG needs hundreds of iterations at 224 px), so CG is preconditioned by one
V-cycle of geometric multigrid:

- prolongation P: bilinear interpolation from every second pixel (the last one
  replicated past the border), restriction its transpose; on the finest level P only writes removed pixels;
- coarse operators: Galerkin products P^T A P, 9-point stencils found by probing with nine
  colourings of the coarse grid (a coarse point's stencil reaches one point of each colour);
  they depend on the mask only, so they are built once per mask and shared by its channels;
- smoothing: one damped Jacobi step before and after the coarse correction (the symmetric
  V(1,1) cycle, so PCG's theory holds); coarsest level (<= 100 points): dense Cholesky.

All masks and channels are solved as one batch (B, C, H, W) on an accelerator, and on a CPU
in groups of masks whose vectors stay in cache (2^19 values: 3 masks of 3 x 224 x 224); the
work is a few dozen stencil applications of the batch. Converges in 6-8 iterations to a
relative residual of 1e-5 for ROAD's masks at 64-224 px (checked against scipy's exact solve in
benchmarks/bench_evaluate.py and against a dense solve in tests/cli/test_faithfulness.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Weights of the 8 neighbours (Rong et al. 2022): edges 1/6, corners 1/12.
EDGE, CORNER = 1 / 6, 1 / 12
OFFSETS = tuple((a, b) for a in (-1, 0, 1) for b in (-1, 0, 1))  # stencil order, (0, 0) = 4
COARSEST = 100  # points at which the hierarchy stops and a dense factorisation takes over
SMOOTH_FINE, SMOOTH_COARSE = 1.0, 0.7  # Jacobi damping (the fine 9-point operator: smoothing factor 1/3)
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
    # On a CPU one thread: the solve is a few hundred small memory-bound ops, which threads
    # barely speed up on an idle machine, and on a busy one each op's barrier waits for a
    # descheduled thread (measured on 2 loaded cores: 224 px, 18 masks, 40 s with 2 threads,
    # 5 s with one).
    threads = torch.get_num_threads()
    single = xs.device.type == "cpu" and threads > 1
    if single:
        torch.set_num_threads(1)
    # On a CPU, masks in groups whose vectors stay in cache (issue 40): PCG's two dozen
    # passes per iteration over 18 masks x 3 channels at 224 px (11 MB a vector) ran from
    # memory; in groups of 3 masks the same solve took 25% less CPU time. Each group stops
    # when its own systems reach ``tol`` (one batch stops when all 18 do; both within tol).
    group = b_ if xs.device.type != "cpu" else max(1, CPU_GROUP_ELEMENTS // max(1, c * h * w))
    try:
        u = torch.cat([pcg(known[i:i + group], m[i:i + group], tol=tol, max_iter=max_iter or 100)[0]
                       for i in range(0, b_, group)])
        out = known + u
    finally:
        if single:
            torch.set_num_threads(threads)
    if noise:
        eps = torch.randn((b_, c, h, w), generator=generator, dtype=work).to(xs.device)
        out = out + m * noise * eps
    return out.to(x.dtype)


def neighbours(t: torch.Tensor) -> torch.Tensor:
    """The weighted sum of each pixel's 8 neighbours (zero outside the image) over the last
    two dims. The weights are separable: (1/12) ([1 2 1] x [1 2 1] - 4 delta), so two
    three-term passes of shifted slices (far faster on a CPU than a one-channel convolution)."""
    import torch
    import torch.nn.functional as F

    h, w = t.shape[-2:]
    p = F.pad(t, (1, 1, 1, 1))  # (..., h + 2, w + 2)
    row = torch.add(p[..., 0:w], p[..., 2:w + 2]).add_(p[..., 1:w + 1], alpha=2)  # (..., h + 2, w)
    out = torch.add(row[..., 0:h, :], row[..., 2:h + 2, :]).add_(row[..., 1:h + 1, :], alpha=2)
    return out.sub_(t, alpha=4).mul_(1 / 12)


# ----------------------------------------------------------------------------- transfer
def prolong(c: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Bilinear interpolation from the coarse grid (every second pixel) (..., hc, wc) to
    (..., h, w), h <= 2 hc: fine pixel 2I is coarse point I, 2I + 1 the mean of I and I + 1
    (the last one replicated past the border, so constants are kept)."""
    return _prolong_last(_prolong_last(c, hw[1]).transpose(-1, -2), hw[0]).transpose(-1, -2)


def _prolong_last(c: torch.Tensor, size: int) -> torch.Tensor:
    import torch

    n = c.shape[-1]
    out = torch.empty(*c.shape[:-1], 2 * n, dtype=c.dtype, device=c.device)
    out[..., 0::2] = c
    if n > 1:
        torch.add(c[..., :-1], c[..., 1:], alpha=1, out=out[..., 1:2 * n - 1:2])
        out[..., 1:2 * n - 1:2].mul_(0.5)
    out[..., -1] = c[..., -1]
    return out[..., :size]


def restrict(f: torch.Tensor, hw_coarse: tuple[int, int]) -> torch.Tensor:
    """The transpose of :func:`prolong`: (..., h, w) -> (..., hc, wc)."""
    return _restrict_last(_restrict_last(f, hw_coarse[1]).transpose(-1, -2), hw_coarse[0]).transpose(-1, -2)


def _restrict_last(f: torch.Tensor, n: int) -> torch.Tensor:
    # c[J] = f[2J] + (f[2J-1] + f[2J+1]) / 2; the last odd pixel belongs wholly to the last point
    import torch.nn.functional as F

    f = F.pad(f, (0, 2 * n - f.shape[-1]))  # the cropped fine pixels contribute nothing
    even, odd = f[..., 0::2], f[..., 1::2]
    c = even.add(odd, alpha=0.5)
    c[..., 1:].add_(odd[..., :-1], alpha=0.5)
    c[..., -1].add_(odd[..., -1], alpha=0.5)
    return c


# ----------------------------------------------------------------------------- hierarchy
@dataclass
class Level:
    """One coarse level: the 9-point stencil (B, 9, 1, hc, wc) of P^T A P, its diagonal's
    damped inverse (0 on decoupled points) and the grid size."""

    stencil: torch.Tensor
    dinv: torch.Tensor
    hw: tuple[int, int]


def apply_stencil(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sum_o s[:, o] * v shifted by o; s (B, 9, 1, h, w), v (B, C, h, w)."""
    import torch.nn.functional as F

    h, w = v.shape[-2:]
    p = F.pad(v, (1, 1, 1, 1))
    out = s[:, 4] * v
    for k, (a, b) in enumerate(OFFSETS):
        if k != 4:
            out = out + s[:, k] * p[..., 1 + a:1 + a + h, 1 + b:1 + b + w]
    return out


def galerkin(op: object, b: int, hw: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """The stencil of P^T op P on the coarse grid ``hw`` (B, 9, 1, hc, wc), by probing with the
    nine colourings (I mod 3, J mod 3): within distance 1 of a coarse point lies exactly one
    point of each colour, so the product of one colouring holds one stencil entry per point."""
    import torch

    hc, wc = hw
    ii = torch.arange(hc, device=like.device)[:, None]
    jj = torch.arange(wc, device=like.device)[None, :]
    colour = (ii % 3) * 3 + jj % 3  # (hc, wc)
    probes = (colour[None] == torch.arange(9, device=like.device)[:, None, None]).to(like.dtype)  # (9, hc, wc)
    got = op(probes[None].expand(b, -1, -1, -1))  # (B, 9 colours, hc, wc)
    entries = []
    for a, bb in OFFSETS:
        want = (((ii + a) % 3) * 3 + (jj + bb) % 3).expand(hc, wc)  # colour of the neighbour at offset
        entries.append(got.gather(1, want[None, None].expand(b, 1, hc, wc)))
    return torch.stack(entries, dim=1)  # (B, 9, 1, hc, wc); entries reaching outside the grid are 0


def hierarchy(m: torch.Tensor, d: torch.Tensor) -> tuple[list[Level], torch.Tensor]:
    """Coarse levels for the masks ``m`` (B, 1, H, W) and the coarsest level's dense Cholesky
    factor (B, n, n), float64 (no levels when the grid is already small: the factor is then
    of the fine system itself)."""
    import torch

    b = m.shape[0]
    hw = (int(m.shape[-2]), int(m.shape[-1]))

    def fine(v: torch.Tensor) -> torch.Tensor:
        mv = m * v
        return m * (d * mv - neighbours(mv))

    levels: list[Level] = []
    op = fine
    active = m  # points with a removed pixel below them; the others are decoupled (zero rows)
    while hw[0] * hw[1] > COARSEST and min(hw) > 2:
        chw = ((hw[0] + 1) // 2, (hw[1] + 1) // 2)

        def coarse_op(v: torch.Tensor, op: Any = op, hw: tuple[int, int] = hw,
                      chw: tuple[int, int] = chw) -> torch.Tensor:
            return restrict(op(prolong(v, hw)), chw)

        active = (restrict(active, chw) > 0).to(m.dtype)  # exact: positive weights on 0/1 values
        s = galerkin(coarse_op, b, chw, m) * active[:, None]
        s = s * _shifted(active, s)  # both ends of a coupling active: exact zeros, symmetric
        diag = s[:, 4]
        dinv = active * SMOOTH_COARSE / torch.where(active > 0, diag, torch.ones_like(diag))
        levels.append(Level(s, dinv, chw))
        op = (lambda v, s=s: apply_stencil(s, v))
        hw = chw
    n = hw[0] * hw[1]
    eye = torch.eye(n, dtype=m.dtype, device=m.device).reshape(1, n, *hw).expand(b, -1, -1, -1)
    mat = op(eye).reshape(b, n, n).double()  # column k = op(e_k)
    mat = (mat + mat.transpose(1, 2)) / 2
    on = active.reshape(b, n).double()
    mat = mat * on[:, :, None] * on[:, None, :]
    scale = mat.diagonal(dim1=1, dim2=2).amax(dim=1, keepdim=True).clamp_min(1e-30)
    # Decoupled points get a unit row. A small shift keeps singular cases factorisable: a mask
    # that removes every pixel (a Neumann problem) and coarse points whose prolongations are
    # dependent; their null directions are zero again after prolongation.
    for shift in (1e-10, 1e-7, 1e-4):
        fix = torch.where(on > 0, shift * scale, torch.ones_like(on))
        chol, info = torch.linalg.cholesky_ex(mat + torch.diag_embed(fix))
        if not bool(info.any()):
            break
    return levels, chol


def _shifted(active: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(B, 9, 1, h, w): whether the neighbour at each stencil offset is active."""
    import torch
    import torch.nn.functional as F

    h, w = active.shape[-2:]
    p = F.pad(active, (1, 1, 1, 1))
    return torch.stack([p[..., 1 + a:1 + a + h, 1 + c:1 + c + w] for a, c in OFFSETS], dim=1).to(s.dtype)


def pcg(known: torch.Tensor, m: torch.Tensor, *, tol: float, max_iter: int) -> tuple[torch.Tensor, int]:
    """The removed pixels' values (0 elsewhere) and the iterations run. known (B, C, H, W),
    0 at removed pixels; m (B, 1, H, W), 1 at removed pixels."""
    import torch

    h, w = known.shape[-2:]
    d = neighbours(torch.ones(1, 1, h, w, dtype=known.dtype, device=known.device))  # in-image weight
    rhs = m * neighbours(known)
    levels, chol = hierarchy(m, d)
    fine_dinv = m * (SMOOTH_FINE / d)

    def op(v: torch.Tensor) -> torch.Tensor:  # v is 0 at kept pixels
        return m * (d * v - neighbours(v))

    def solve(level: int, r: torch.Tensor) -> torch.Tensor:
        if level == len(levels):
            c = r.shape[1]
            hw = r.shape[-2:]
            z = torch.cholesky_solve(r.reshape(r.shape[0], c, -1).transpose(1, 2).double(), chol)
            return z.transpose(1, 2).reshape(r.shape[0], c, *hw).to(r.dtype)
        dinv, a = (fine_dinv, op) if level == 0 else (levels[level - 1].dinv, lambda v, s=levels[level - 1].stencil:
                                                        apply_stencil(s, v))
        hw = tuple(r.shape[-2:])
        x = dinv * r  # pre-smoothing from 0
        coarse = solve(level + 1, restrict(r - a(x), levels[level].hw))
        up = prolong(coarse, hw)
        x = x + (m * up if level == 0 else up)
        return x + dinv * (r - a(x))  # post-smoothing

    u = torch.zeros_like(known)
    r = rhs.clone()
    z = solve(0, r)
    p = z
    rz = (r * z).sum(dim=(2, 3), keepdim=True)
    bound = (tol * rhs.norm(dim=(2, 3), keepdim=True)) ** 2 + 1e-30
    it = 0
    for it in range(max_iter + 1):
        if it == max_iter or bool(((r * r).sum(dim=(2, 3), keepdim=True) <= bound).all()):
            break
        ap = op(p)
        denom = (p * ap).sum(dim=(2, 3), keepdim=True)
        alpha = torch.where(denom > 0, rz / denom.clamp_min(1e-30), torch.zeros_like(rz))
        u = u + alpha * p
        r = r - alpha * ap
        z = solve(0, r)
        rz_new = (r * z).sum(dim=(2, 3), keepdim=True)
        p = z + (rz_new / rz.clamp_min(1e-30)) * p
        rz = rz_new
    return u, it
