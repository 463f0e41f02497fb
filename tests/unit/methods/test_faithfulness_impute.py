"""ROAD's imputation by multigrid-preconditioned CG, checked against independent solves: a
dense ``numpy.linalg.solve`` of Rong et al.'s system (sizes that build several multigrid
levels, odd and even), and pytorch-grad-cam's scipy ``spsolve`` and ROAD metrics (skipped
when pytorch-grad-cam is not installed; it is in the ``bench`` extra).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inspect_model.methods.faithfulness import metrics as fa
from inspect_model.methods.faithfulness import impute as fi
from inspect_model.methods.faithfulness.passes import MapJob, evaluate_maps
from inspect_model.methods.faithfulness import multigrid as mg
from inspect_model.methods.faithfulness import native
from cli.test_faithfulness import ref_impute, tiny


@pytest.fixture(autouse=True, params=["native", "torch"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: float32 solves with the native passes (native.py) and with torch's ops."""
    if request.param == "native" and native.library() is None:
        pytest.skip("no C compiler: the torch passes only")
    if request.param == "torch":
        monkeypatch.setattr(native, "usable", lambda t: None)
    return str(request.param)


@pytest.mark.parametrize("hw", [(16, 16), (37, 29), (24, 41)])
def test_multigrid_solves_the_dense_system(hw: tuple[int, int]) -> None:
    rng = np.random.default_rng(hw[0])
    h, w = hw
    img = rng.normal(size=(3, h, w))
    remove = np.stack([rng.random((h, w)) < 0.5, np.zeros((h, w), bool), rng.random((h, w)) < 0.97])
    remove[1, 2:h - 3, 1:w - 2] = True  # one large hole: the case plain CG is slow on
    m = torch.from_numpy(remove)[:, None].double()
    known = torch.from_numpy(img)[None] * (1 - m)
    levels, _ = fi.hierarchy(m, fi.neighbours(torch.ones(1, 1, h, w, dtype=torch.float64)))
    assert levels, "the grid is large enough for a coarse level"
    u, iters = fi.pcg(known, m, tol=1e-11, max_iter=200)
    assert iters < 40  # plain CG needs ~h + w here; the V-cycle keeps this flat
    got = (known + u).numpy()
    for b in range(3):
        np.testing.assert_allclose(got[b], ref_impute(img, remove[b]), atol=1e-8)


def test_transfer_operators_are_transposes_and_keep_constants() -> None:
    torch.manual_seed(0)
    for hw, chw in (((9, 7), (5, 4)), ((8, 8), (4, 4)), ((3, 2), (2, 1))):
        c = torch.randn(2, 3, *chw, dtype=torch.float64)
        f = torch.randn(2, 3, *hw, dtype=torch.float64)
        lhs = float((fi.prolong(c, hw) * f).sum())
        assert lhs == pytest.approx(float((c * fi.restrict(f, chw)).sum()), abs=1e-10)
        ones = fi.prolong(torch.ones(1, 1, *chw, dtype=torch.float64), hw)
        assert float((ones - 1).abs().max()) == 0.0


def test_coarse_stencils_equal_the_galerkin_product() -> None:
    torch.manual_seed(1)
    h, w = 30, 27
    m = (torch.rand(2, 1, h, w) < 0.7).double()
    d = fi.neighbours(torch.ones(1, 1, h, w, dtype=torch.float64))
    levels, _ = fi.hierarchy(m, d)
    v = torch.randn(2, 3, *levels[0].hw, dtype=torch.float64)
    fine = fi.prolong(v, (h, w)) * m
    want = fi.restrict(m * (d * fine - fi.neighbours(fine)), levels[0].hw)
    torch.testing.assert_close(fi.apply_stencil(levels[0].stencil, v), want)


def test_nothing_to_interpolate_from_gives_zeros() -> None:
    x = torch.randn(3, 20, 20)
    out = fa.impute(x, torch.ones(1, 20, 20, dtype=torch.bool))
    assert torch.isfinite(out).all() and float(out.abs().max()) == 0.0
    same = fa.impute(x, torch.zeros(1, 20, 20, dtype=torch.bool))
    assert torch.equal(same[0], x)


def test_imputation_and_road_match_pytorch_grad_cam(monkeypatch: pytest.MonkeyPatch) -> None:
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    targets = pytest.importorskip("pytorch_grad_cam.utils.model_targets")
    model = tiny()
    torch.manual_seed(2)
    x = torch.randn(1, 3, 20, 20)
    sal = torch.rand(20, 20)  # distinct values: both rules pick the same pixels
    order = fa.pixel_order(sal)
    masks = torch.cat([fa.road_masks(order, (20, 20), fa.ROAD_FRACTIONS, first) for first in (True, False)])
    ours = fa.impute(x[0], masks)
    imputer = road.NoisyLinearImputer(noise=0.0)
    theirs = torch.stack([imputer(x[0], (~m).float()) for m in masks])
    assert float((ours - theirs).abs().max()) < 1e-4

    monkeypatch.setattr(fa, "ROAD_NOISE", 0.0)  # the peer's noise cannot share our random stream
    cls = 1
    [res], _ = evaluate_maps(model, x, [MapJob(0, cls, sal)], metrics=["road"], batch=9)
    target = [targets.ClassifierOutputSoftmaxTarget(cls)]
    for name, metric in (("road_morf", road.ROADMostRelevantFirst), ("road_lerf", road.ROADLeastRelevantFirst)):
        curve = []
        for f in fa.ROAD_FRACTIONS:
            # pytorch-grad-cam removes the pixels at or above its percentile p: our fraction 1 - p/100
            peer = metric(percentile=round(100 * (1 - f)))
            peer.perturbation.imputer.noise = 0.0
            with torch.no_grad():
                curve.append(float(peer(x, sal.numpy()[None], target, model, return_diff=False)[0]))
        np.testing.assert_allclose(res.curves[name], curve, atol=1e-4)
    combined = (np.mean(res.curves["road_lerf"]) - np.mean(res.curves["road_morf"])) / 2
    assert res.scores["road"] == pytest.approx(combined, abs=1e-6)


def test_native_passes_equal_torch_bit_for_bit(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each native pass (the Galerkin product included) against the torch ops it replaces, odd
    and even sizes (both border rules of the transfers), and a whole float32 solve: the same
    floats, not just close."""
    lib = native.library()
    if path == "torch":
        pytest.skip("compares the two paths")
    torch.manual_seed(0)
    for h, w in ((37, 29), (24, 41), (2, 5)):
        m = (torch.rand(3, 1, h, w) < 0.6).float()
        d = fi.neighbours(torch.ones(1, 1, h, w))
        centre, edge, g = m * (d + 1 / 3), m * (1 / 12), m * (1.0 / d)
        v, r = torch.randn(3, 2, h, w), torch.randn(3, 2, h, w)
        ps = native.Passes(lib, centre, edge)
        op = torch.mul(centre, v).addcmul_(edge, fi.box(v), value=-1)
        assert torch.equal(ps.fine(v), op)
        res = torch.addcmul(r, centre, v, value=-1).addcmul_(edge, fi.box(v))
        assert torch.equal(ps.fine(v, r), res)
        assert torch.equal(ps.fine(v, r, g), v.clone().addcmul_(g, res))
        hc, wc = (h + 1) // 2, (w + 1) // 2
        s = torch.randn(3, 9, 1, hc, wc)
        vc, rc, gc = torch.randn(3, 2, hc, wc), torch.randn(3, 2, hc, wc), torch.rand(3, 1, hc, wc)
        av = fi.apply_stencil(s, vc)
        assert torch.equal(ps.stencil(s, vc), av) and torch.equal(ps.stencil(s, vc, rc), rc - av)
        assert torch.equal(ps.stencil(s, vc, rc, gc), vc.clone().addcmul_(gc, rc - av))
        assert torch.equal(ps.restrict(v, (hc, wc)), fi.restrict(v, (hc, wc)))
        fine_s = torch.randn(3, 9, h, w)
        with monkeypatch.context() as mp:
            mp.setattr(native, "usable", lambda t: None)
            want_s = mg.galerkin(fine_s, (hc, wc))
        assert torch.equal(mg.galerkin(fine_s, (hc, wc)), want_s)
        assert torch.equal(ps.prolong_add(vc, v.clone()), v + fi.prolong(vc, (h, w)))
        assert torch.equal(ps.prolong_add(vc, v.clone(), m), v.clone().addcmul_(m, fi.prolong(vc, (h, w))))
    remove = torch.rand(6, 64, 48) < torch.linspace(0.1, 0.9, 6)[:, None, None]
    # an image, and a batch in channels_last (the loops read NCHW: a copy is taken)
    for x in (torch.randn(3, 64, 48), torch.randn(6, 3, 64, 48).contiguous(memory_format=torch.channels_last)):
        got = fa.impute(x, remove)
        with monkeypatch.context() as mp:
            mp.setattr(native, "usable", lambda t: None)
            want = fa.impute(x, remove)
        assert torch.equal(got, want)
