"""The geometric multigrid hierarchy behind ROAD's imputation (:mod:`.impute`): the fine
operator, the transfer operators and the Galerkin coarse operators, all as 9-point stencils.

- prolongation P: bilinear interpolation from every second pixel (the last one replicated
  past the border), restriction its transpose; both work along rows and columns in place of
  transposes (a transposed view runs the inner loop with a stride);
- coarse operators: the Galerkin product P^T A P formed directly from A's stencil (issue 40:
  probing it with nine colourings of the coarse grid cost a quarter of the solve). P is a
  tensor product of 1-D interpolations p, so entry o of the coarse stencil at point I is
  sum_e sum_i p_y p_y' p_x p_x' s_e[i], a sum of 1-D three-tap passes along the columns then
  the rows, whose weights p(i, I) p(i + e, I + o) come from :func:`prolong` itself;
- each level's points with no removed pixel below them are decoupled (zero rows and columns).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inspect_model.methods.faithfulness import native

if TYPE_CHECKING:
    import torch

# Weights of the 8 neighbours (Rong et al. 2022): edges 1/6, corners 1/12.
EDGE, CORNER = 1 / 6, 1 / 12
OFFSETS = tuple((a, b) for a in (-1, 0, 1) for b in (-1, 0, 1))  # stencil order (row, column), (0, 0) = 4
COARSEST = 200  # points (14 x 14) at which the hierarchy stops and a dense factorisation takes over
SMOOTH_COARSE = 0.9  # Jacobi damping on the coarse levels (0.7: 16% more iterations on ROAD masks, 224 px)
ROW_SHARE = 0.55  # at least this share of a row's absolute sum in the smoother's diagonal (> 1/2)
# The 1-D (coarse offset o, fine offset e) pairs whose hats overlap: |2 o - e| <= 2.
PAIRS = tuple((o, e) for o in (-1, 0, 1) for e in (-1, 0, 1) if abs(2 * o - e) <= 2)


def neighbours(t: torch.Tensor) -> torch.Tensor:
    """The weighted sum of each pixel's 8 neighbours (zero outside the image) over the last
    two dims. The weights are separable: (1/12) ([1 2 1] x [1 2 1] - 4 delta)."""
    return box(t).sub_(t, alpha=4).mul_(1 / 12)


def box(t: torch.Tensor) -> torch.Tensor:
    """[1 2 1] x [1 2 1] over the last two dims, zero outside: two three-term passes of
    shifted slices (far faster on a CPU than a one-channel convolution), written into the
    output's inner part with the two border lines copied (20% faster than a padded copy)."""
    import torch
    import torch.nn.functional as F

    h, w = t.shape[-2:]
    if min(h, w) < 3:
        p = F.pad(t, (1, 1, 1, 1))  # (..., h + 2, w + 2)
        row = torch.add(p[..., 0:w], p[..., 2:w + 2]).add_(p[..., 1:w + 1], alpha=2)  # (..., h + 2, w)
        return torch.add(row[..., 0:h, :], row[..., 2:h + 2, :]).add_(row[..., 1:h + 1, :], alpha=2)
    row = torch.empty_like(t)
    torch.add(t[..., :-2], t[..., 2:], out=row[..., 1:-1])
    row[..., 0] = t[..., 1]
    row[..., -1] = t[..., -2]
    row.add_(t, alpha=2)
    out = torch.empty_like(t)
    torch.add(row[..., :-2, :], row[..., 2:, :], out=out[..., 1:-1, :])
    out[..., 0, :] = row[..., 1, :]
    out[..., -1, :] = row[..., -2, :]
    return out.add_(row, alpha=2)


# ----------------------------------------------------------------------------- transfer
def _axis(t: torch.Tensor, dim: int, sl: slice) -> torch.Tensor:
    return t[(Ellipsis, sl) if dim == -1 else (Ellipsis, sl, slice(None))]


def prolong(c: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Bilinear interpolation from the coarse grid (every second pixel) (..., hc, wc) to
    (..., h, w), h <= 2 hc: fine pixel 2I is coarse point I, 2I + 1 the mean of I and I + 1
    (the last one replicated past the border, so constants are kept)."""
    return _prolong_axis(_prolong_axis(c, hw[1], -1), hw[0], -2)


def _prolong_axis(c: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    import torch

    n = c.shape[dim]
    shape = list(c.shape)
    shape[dim] = size
    out = torch.empty(shape, dtype=c.dtype, device=c.device)
    _axis(out, dim, slice(0, size, 2)).copy_(_axis(c, dim, slice(0, (size + 1) // 2)))
    if n > 1:
        odd = _axis(out, dim, slice(1, min(2 * n - 1, size), 2))  # means of I and I + 1
        k = odd.shape[dim]
        torch.add(_axis(c, dim, slice(0, k)), _axis(c, dim, slice(1, k + 1)), out=odd).mul_(0.5)
    if size == 2 * n:
        _axis(out, dim, slice(size - 1, size)).copy_(_axis(c, dim, slice(n - 1, n)))
    return out


def restrict(f: torch.Tensor, hw_coarse: tuple[int, int]) -> torch.Tensor:
    """The transpose of :func:`prolong`: (..., h, w) -> (..., hc, wc)."""
    return _restrict_axis(_restrict_axis(f, hw_coarse[0], -2), hw_coarse[1], -1)  # rows first: contiguous


def _restrict_axis(f: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    # c[J] = f[2J] + (f[2J-1] + f[2J+1]) / 2; the last odd pixel belongs wholly to the last point
    size = f.shape[dim]
    c = _axis(f, dim, slice(0, size, 2)).clone()  # n values: size is 2n - 1 or 2n
    odd = _axis(f, dim, slice(1, size, 2))  # n - 1 or n values
    k = min(odd.shape[dim], n - 1)
    _axis(c, dim, slice(0, k)).add_(_axis(odd, dim, slice(0, k)), alpha=0.5)
    _axis(c, dim, slice(1, k + 1)).add_(_axis(odd, dim, slice(0, k)), alpha=0.5)
    if odd.shape[dim] == n:  # size 2n: pixel 2n - 1 is the last point's copy
        _axis(c, dim, slice(n - 1, n)).add_(_axis(odd, dim, slice(n - 1, n)))
    return c


# ----------------------------------------------------------------------------- stencils
@dataclass
class Level:
    """One coarse level: the 9-point stencil (B, 9, 1, hc, wc) of P^T A P, its diagonal's
    damped inverse (0 on decoupled points) and the grid size."""

    stencil: torch.Tensor
    dinv: torch.Tensor
    hw: tuple[int, int]


def _span(a: int, n: int) -> tuple[slice, slice]:
    """Where a shift by ``a`` along an axis of n points lands (destination, source): the
    points whose neighbour at offset a lies inside."""
    return slice(max(0, -a), n - max(0, a)), slice(max(0, a), n + min(0, a))


def apply_stencil(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sum_o s[:, o] * v shifted by o; s (B, 9, 1, h, w), v (B, C, h, w) (zero outside)."""
    import torch.nn.functional as F

    h, w = v.shape[-2:]
    p = F.pad(v, (1, 1, 1, 1))
    out = s[:, 4] * v
    for k, (a, b) in enumerate(OFFSETS):
        if k != 4:
            out.addcmul_(s[:, k], p[..., 1 + a:1 + a + h, 1 + b:1 + b + w])
    return out


def fine_stencil(m: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The stencil (B, 9, H, W) of the fine operator v -> m (d (m v) - neighbours(m v)):
    m d at the centre, -weight m m' to each neighbour (0 where either pixel is kept)."""
    import torch

    b, _, h, w = m.shape
    out = torch.zeros(b, 9, h, w, dtype=m.dtype, device=m.device)
    torch.mul(m[:, 0], d[:, 0], out=out[:, 4])
    for k, (a, c) in enumerate(OFFSETS):
        if k != 4:
            (ry, sy), (rx, sx) = _span(a, h), _span(c, w)
            dst = out[:, k, ry, rx]
            torch.mul(m[:, 0, ry, rx], m[:, 0, sy, sx], out=dst).mul_(-(EDGE if a == 0 or c == 0 else CORNER))
    return out


@functools.lru_cache(maxsize=256)
def _taps(n_fine: int, n_coarse: int, dtype: torch.dtype, device: torch.device,
          dim: int) -> dict[tuple[int, int], tuple[tuple[int, torch.Tensor], ...]]:
    """Per 1-D pair (o, e) of :data:`PAIRS`: the taps k in (0, -1, 1) with their weights
    p(2I + k, I) p(2I + k + e, I + o) per coarse point I (zero ones left out), p the 1-D
    prolongation matrix of :func:`prolong` (its border rule included), shaped to broadcast
    along ``dim``."""
    import torch

    p = _prolong_axis(torch.eye(n_coarse, dtype=torch.float64), n_fine, -1).T.tolist()  # p[i][I]

    def at(i: int, j: int) -> float:
        return p[i][j] if 0 <= i < n_fine and 0 <= j < n_coarse else 0.0

    shape = (n_coarse,) if dim == -1 else (n_coarse, 1)
    out = {}
    for o, e in PAIRS:
        taps = []
        for k in (0, -1, 1):  # the centre first: it covers every coarse point
            wts = [at(2 * i + k, i) * at(2 * i + k + e, i + o) for i in range(n_coarse)]
            if any(wts):
                taps.append((k, torch.tensor(wts, dtype=dtype, device=device).reshape(shape)))
        out[(o, e)] = tuple(taps)
    return out


@functools.lru_cache(maxsize=1)
def _PAIRS_I32() -> torch.Tensor:  # noqa: N802
    import torch

    return torch.tensor(PAIRS, dtype=torch.int32)


@functools.lru_cache(maxsize=256)
def _tables(n_fine: int, n_coarse: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_taps` (float32, CPU) as the native Galerkin pass reads them: weights (7, 3, n)
    and presence (7, 3) per pair of :data:`PAIRS` and tap k in (0, -1, 1) (absent: zeros)."""
    import torch

    taps = _taps(n_fine, n_coarse, torch.float32, torch.device("cpu"), dim)
    wts = torch.zeros(len(PAIRS), 3, n_coarse, dtype=torch.float32)
    present = torch.zeros(len(PAIRS), 3, dtype=torch.int32)
    for q, pair in enumerate(PAIRS):
        for k, wk in taps[pair]:
            wts[q, (0, -1, 1).index(k)] = wk.reshape(-1)
            present[q, (0, -1, 1).index(k)] = 1
    return wts, present


def _pass(f: torch.Tensor, n: int, dim: int, taps: tuple[tuple[int, torch.Tensor], ...],
          out: torch.Tensor) -> None:
    """out = sum_k w_k[I] f[2I + k] along ``dim`` (n points there; f has 2n - 1 or 2n). The
    weights are 0 where 2I + k falls outside f, so those points are left out of the slices."""
    import torch

    size = f.shape[dim]
    if not taps or taps[0][0] != 0:
        out.zero_()
    for k, w in taps:
        lo = 1 if k < 0 else 0  # I = 0 would read f[-1]
        hi = n if k <= 0 else size // 2  # the last I with 2I + 1 inside
        src = _axis(f, dim, slice(2 * lo + k, 2 * (hi - 1) + k + 1, 2))
        dst = _axis(out, dim, slice(lo, hi))
        wk = _axis(w, dim, slice(lo, hi)) if dim == -1 else w[lo:hi]
        if k == 0:
            torch.mul(src, wk, out=dst)
        else:
            dst.addcmul_(src, wk)


def galerkin(s: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """The stencil (B, 9, hc, wc) of P^T A P on the coarse grid ``hw`` from A's stencil
    s (B, 9, h, w): a pass along the columns for each (o_x, e_x) pair, then one along the
    rows for each (o_y, e_y) pair, summed into coarse offset (o_y, o_x)."""
    import torch

    b, _, h, w = s.shape
    hc, wc = hw
    lib = native.usable(s)
    if lib is not None and s.is_contiguous():  # the same sums in one native call (issue 40)
        return native.galerkin(lib, s, hw, _PAIRS_I32(), _tables(w, wc, -1), _tables(h, hc, -2))
    tx, ty = _taps(w, wc, s.dtype, s.device, -1), _taps(h, hc, s.dtype, s.device, -2)
    s5 = s.reshape(b, 3, 3, h, w)  # (B, e_y, e_x, h, w)
    cols = torch.empty(b, len(PAIRS), 3, h, wc, dtype=s.dtype, device=s.device)  # (B, pair_x, e_y, h, wc)
    for q, (ox, ex) in enumerate(PAIRS):
        _pass(s5[:, :, ex + 1], wc, -1, tx[(ox, ex)], cols[:, q])
    out = torch.zeros(b, 3, 3, hc, wc, dtype=s.dtype, device=s.device)  # (B, o_y, o_x, hc, wc)
    ox_index = torch.tensor([o + 1 for o, _ in PAIRS], device=s.device)
    rows = torch.empty(b, len(PAIRS), hc, wc, dtype=s.dtype, device=s.device)
    for oy, ey in PAIRS:
        _pass(cols[:, :, ey + 1], hc, -2, ty[(oy, ey)], rows)
        out[:, oy + 1].index_add_(1, ox_index, rows)
    return out.reshape(b, 9, hc, wc)


def shifted(active: torch.Tensor) -> torch.Tensor:
    """(B, 9, h, w): whether the neighbour at each stencil offset is active."""
    import torch
    import torch.nn.functional as F

    h, w = active.shape[-2:]
    p = F.pad(active, (1, 1, 1, 1))
    return torch.cat([p[..., 1 + a:1 + a + h, 1 + c:1 + c + w] for a, c in OFFSETS], dim=1)


def dense(s: torch.Tensor) -> torch.Tensor:
    """The matrix (B, n, n) of the stencil s (B, 9, h, w), n = h w: row i holds s_o[i] at
    column i + o."""
    import torch

    b, _, h, w = s.shape
    n = h * w
    mat = torch.zeros(b, n, n, dtype=s.dtype, device=s.device)
    idx = torch.arange(n, device=s.device).reshape(h, w)
    for k, (a, c) in enumerate(OFFSETS):
        (ry, sy), (rx, sx) = _span(a, h), _span(c, w)
        mat[:, idx[ry, rx].reshape(-1), idx[sy, sx].reshape(-1)] = s[:, k, ry, rx].reshape(b, -1)
    return mat


def hierarchy(m: torch.Tensor, d: torch.Tensor) -> tuple[list[Level], torch.Tensor]:
    """Coarse levels for the masks ``m`` (B, 1, H, W) and the coarsest level's dense Cholesky
    factor (B, n, n), float64 (no levels when the grid is already small: the factor is then
    of the fine system itself)."""
    import torch

    b = m.shape[0]
    hw = (int(m.shape[-2]), int(m.shape[-1]))
    s = fine_stencil(m, d)  # (B, 9, H, W)
    levels: list[Level] = []
    active = m  # points with a removed pixel below them; the others are decoupled (zero rows)
    while hw[0] * hw[1] > COARSEST and min(hw) > 2:
        hw = ((hw[0] + 1) // 2, (hw[1] + 1) // 2)
        active = (restrict(active, hw) > 0).to(m.dtype)  # exact: positive weights on 0/1 values
        s = galerkin(s, hw) * active
        s = s * shifted(active)  # both ends of a coupling active: exact zeros, symmetric
        # Damped Jacobi, damped further where a row's couplings outweigh its diagonal: the
        # smoother's M = max(diag / omega, 0.55 * row's absolute sum) makes 2M - A diagonally
        # dominant, so the V-cycle stays symmetric positive definite (PCG's premise). Galerkin
        # rows at a mask's edge reach lambda_max(D^-1 A) = 4, where plain damping broke PCG.
        diag = torch.maximum(s[:, 4:5] / SMOOTH_COARSE, ROW_SHARE * s.abs().sum(dim=1, keepdim=True))
        dinv = active / torch.where(active > 0, diag, torch.ones_like(diag))
        levels.append(Level(s[:, :, None], dinv, hw))
    n = hw[0] * hw[1]
    mat = dense(s).double()
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
