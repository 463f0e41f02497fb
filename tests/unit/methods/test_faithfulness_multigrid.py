"""ROAD's multigrid hierarchy (methods/faithfulness/multigrid.py): the coarse stencils formed
directly from the finer stencil equal the Galerkin product P^T A P applied the slow way
(prolong, apply the finer operator, restrict), on every level, for odd and even sizes; the
dense coarsest matrix equals the stencil applied to unit vectors."""

from __future__ import annotations

import pytest
import torch

from inspect_model.methods.faithfulness import multigrid as mg


@pytest.mark.parametrize("hw", [(30, 27), (33, 40), (64, 64)])
def test_every_level_is_the_galerkin_product_of_the_one_above(hw: tuple[int, int]) -> None:
    torch.manual_seed(hw[0])
    h, w = hw
    m = (torch.rand(3, 1, h, w) < torch.tensor([0.3, 0.7, 0.97])[:, None, None, None]).double()
    m[0, :, 3:h - 4, 2:w - 5] = 1.0  # one large hole
    d = mg.neighbours(torch.ones(1, 1, h, w, dtype=torch.float64))
    levels, _ = mg.hierarchy(m, d)
    assert len(levels) >= 2
    fine = mg.fine_stencil(m, d)[:, :, None]  # (B, 9, 1, H, W)
    above, above_hw = fine, (h, w)
    for lv in levels:
        v = torch.randn(3, 2, *lv.hw, dtype=torch.float64)
        want = mg.restrict(mg.apply_stencil(above, mg.prolong(v, above_hw)), lv.hw)
        active = lv.dinv != 0  # decoupled points: zero rows (and columns) on this level
        got = mg.apply_stencil(lv.stencil, v * active)
        torch.testing.assert_close(got, want * active, rtol=1e-10, atol=1e-12)
        above, above_hw = lv.stencil, lv.hw


def test_fine_stencil_is_the_masked_operator() -> None:
    torch.manual_seed(0)
    m = (torch.rand(2, 1, 13, 11) < 0.6).double()
    d = mg.neighbours(torch.ones(1, 1, 13, 11, dtype=torch.float64))
    v = torch.randn(2, 3, 13, 11, dtype=torch.float64)
    want = m * (d * (m * v) - mg.neighbours(m * v))
    torch.testing.assert_close(mg.apply_stencil(mg.fine_stencil(m, d)[:, :, None], v), want)


def test_dense_matrix_is_the_stencil_on_unit_vectors() -> None:
    torch.manual_seed(1)
    s = torch.randn(2, 9, 5, 4, dtype=torch.float64)
    n = 20
    eye = torch.eye(n, dtype=torch.float64).reshape(1, n, 5, 4).expand(2, -1, -1, -1)
    columns = mg.apply_stencil(s[:, :, None], eye).reshape(2, n, n)  # [b, k, i] = (A e_k)_i
    torch.testing.assert_close(mg.dense(s), columns.transpose(1, 2))


def test_groups_side_by_side_give_the_same_images(monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_model.methods.faithfulness import impute as fi

    torch.manual_seed(2)
    x = torch.randn(3, 40, 40)
    remove = torch.rand(7, 40, 40) < torch.linspace(0.1, 0.9, 7)[:, None, None]
    monkeypatch.setattr(fi, "CPU_GROUP_ELEMENTS", 3 * 40 * 40 * 2)  # groups of 2 masks: 4 groups
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fi.impute(x, remove)  # one group after another
        torch.set_num_threads(2)
        two = fi.impute(x, remove)  # groups on 2 Python threads
        assert torch.get_num_threads() == 2  # restored after the solve
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(one, two)


def _hard_masks(size: int) -> torch.Tensor:
    """Masks whose Galerkin levels have rows with couplings up to 3x their diagonal."""
    g = torch.Generator().manual_seed(size)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    stripes, checker = (xx // 3) % 2 == 0, (xx + yy) % 2 == 0
    return torch.stack([torch.rand(size, size, generator=g) < 0.5, torch.rand(size, size, generator=g) < 0.97,
                        stripes, ~stripes, checker, ((xx // 2) + (yy // 2)) % 2 == 0])


def test_coarse_smoother_keeps_the_cycle_positive_definite() -> None:
    # 2M - A diagonally dominant on every smoothed level (M = 1 / dinv): the V(1,1) cycle is
    # then symmetric positive definite whatever the mask (plain damping 0.7 was not: rows at
    # a mask's edge reach lambda_max(D^-1 A) = 4).
    m = _hard_masks(100)[:, None].double()
    d = mg.neighbours(torch.ones(1, 1, 100, 100, dtype=torch.float64))
    levels, _ = mg.hierarchy(m, d)
    for lv in levels[:-1]:  # the last level is solved directly
        s = lv.stencil[:, :, 0]  # (B, 9, h, w)
        on = lv.dinv > 0
        margin = 2 / torch.where(on, lv.dinv, torch.ones_like(lv.dinv)) - s.abs().sum(dim=1, keepdim=True)
        assert bool((margin[on] >= 0).all())


def test_pcg_converges_on_hard_masks() -> None:
    from inspect_model.methods.faithfulness import impute as fi

    torch.manual_seed(3)
    masks = _hard_masks(96)
    x = torch.randn(3, 96, 96, dtype=torch.float64)
    m = masks[:, None].double()
    u, iters = fi.pcg(x[None] * (1 - m), m, tol=1e-9, max_iter=100)
    assert iters <= 20  # 9 here; a preconditioner that is not positive definite can stall at 100
    res = m * (fi.neighbours(torch.ones(1, 1, 96, 96, dtype=torch.float64)) * u - fi.neighbours(u)) \
        - m * fi.neighbours(x[None] * (1 - m))
    assert float(res.abs().max()) < 1e-6
