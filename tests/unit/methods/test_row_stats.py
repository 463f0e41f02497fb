"""The fast statistics of large float32 tensors (methods/row_stats.py, issue 40) against the
exact float64 path, the cases that must fall back to it, and the reuse of an output
gradient's statistics for the input gradient that is the same memory."""

from __future__ import annotations

import math

import pytest
import torch

from inspect_model.methods.row_stats import FAST_MIN, SeenGradients, fast_stats, l2_norm
from inspect_model.methods.stats import tensor_stats

FIELDS = ("mean", "std", "min", "max", "abs_mean", "norm")


def _close(fast, exact, rel=2e-6):  # noqa: ANN001
    assert fast.numel == exact.numel
    for f in FIELDS:
        a, b = getattr(fast, f), getattr(exact, f)
        scale = max(abs(b), exact.norm / math.sqrt(exact.numel)) if f == "mean" else abs(b)
        assert abs(a - b) <= rel * scale + 1e-30, (f, a, b)
    # counts are exact
    assert fast.zero_fraction == exact.zero_fraction
    assert fast.negative_fraction == exact.negative_fraction
    assert (fast.nan_count, fast.inf_count) == (0, 0)


def _tensors():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, 28, 28, generator=g)
    relu_grad = x * (torch.rand(x.shape, generator=g) > 0.5)  # many exact zeros
    small = torch.randn(4, 3, 100, 100, generator=g) * 1e-9
    return {"randn": x, "relu-grad": relu_grad, "tiny-scale": small,
            "2d": torch.randn(16, 8192, generator=g), "odd-rows": torch.randn(5, 7, 1873, generator=g)}


@pytest.mark.parametrize("name", list(_tensors()))
def test_fast_stats_match_the_exact_path(name: str) -> None:
    t = _tensors()[name]
    n = t.shape[0]
    got = fast_stats(t, n)
    assert got is not None, "the fast path should take a large finite float32 tensor"
    stats, per = got
    _close(stats, tensor_stats(t, exact=True))
    exact_per = torch.linalg.vector_norm(t.reshape(n, -1), dim=1, dtype=torch.float64).tolist()
    assert per == pytest.approx(exact_per, rel=2e-6)
    _close(tensor_stats(t), tensor_stats(t, exact=True))  # tensor_stats takes the fast path too
    assert l2_norm(t) == pytest.approx(stats.norm, rel=2e-6)


@pytest.mark.parametrize("case", ["nan", "inf", "huge", "underflow", "offset-mean", "small", "float64", "prime"])
def test_fast_stats_falls_back_where_digits_could_be_lost(case: str) -> None:
    g = torch.Generator().manual_seed(1)
    t = torch.randn(4, 32, 32, 32, generator=g)
    if case == "nan":
        t[1, 2, 3, 4] = float("nan")
    elif case == "inf":
        t[0, 0, 0, 0] = -float("inf")
    elif case == "huge":
        t = t * 1e20  # squares leave float32's range
    elif case == "underflow":
        t = t * 1e-25
    elif case == "offset-mean":
        t = t * 1e-3 + 5.0  # E[x^2] - mean^2 would cancel float32 digits
    elif case == "small":
        t = t.reshape(-1)[:FAST_MIN - 1]
    elif case == "float64":
        t = t.double()
    elif case == "prime":
        t = torch.randn(1, 65537, generator=g)  # no row length divides the values
    assert fast_stats(t, t.shape[0]) is None
    if case in ("huge", "underflow"):  # exact through tensor_stats and l2_norm
        e = tensor_stats(t, exact=True)
        assert tensor_stats(t) == e
        assert l2_norm(t) == pytest.approx(e.norm, rel=1e-12)


def test_seen_gradients_reuses_the_same_memory_only() -> None:
    seen = SeenGradients()
    g = torch.randn(4, 64, 32, 32)
    first = seen.measure(g, 4)
    flat = g.view(4, -1)  # a flatten between two layers: the same values, another shape
    assert seen.measure(flat, 4) == first
    g.mul_(2)  # an in-place change bumps the version: measured again
    again = seen.measure(g, 4)
    assert again[0].norm == pytest.approx(2 * first[0].norm, rel=1e-6)
    other = g.clone()
    assert seen.measure(other, 4) == again  # equal values in other memory: measured, same result
    # Memory given back and taken again (the same address, other values): never a hit.
    seen2 = SeenGradients()
    a = torch.randn(4, 64, 32, 32)
    first = seen2.measure(a, 4)
    ptr = a.data_ptr()
    del a
    b = torch.full((4, 64, 32, 32), 3.0)
    got = seen2.measure(b, 4)
    assert got[0].mean == pytest.approx(3.0) and (b.data_ptr() != ptr or got != first)
    seen.clear()
    assert not seen._seen


def test_grads_numbers_on_a_model_large_enough_for_the_fast_path() -> None:
    """Layer gradient statistics of `grads` against gradients captured independently."""
    from torch import nn

    from inspect_model.methods.gradients.flow import gradients

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(32, 10)).eval()
    x = torch.randn(4, 3, 48, 48)
    rep = gradients(model, x)
    # Independent: the same objective (sum of each image's top class score), tensor hooks.
    outs: dict[str, torch.Tensor] = {}

    def keep(name: str):  # noqa: ANN202
        def hook(mod, inp, out):  # noqa: ANN001, ANN202
            out.register_hook(lambda g: outs.__setitem__(name, g.detach().clone()))
        return hook

    hs = [m.register_forward_hook(keep(n)) for n, m in model.named_children()]
    xx = x.clone().requires_grad_(True)
    y = model(xx)
    y.gather(1, y.argmax(1, keepdim=True)).sum().backward()
    for h in hs:
        h.remove()
    layers = {r.key: r for r in rep.layers}
    checked = 0
    for name, g in outs.items():
        exact = tensor_stats(g, exact=True)
        got = layers[name].grad_output
        assert got.numel == exact.numel
        assert got.norm == pytest.approx(exact.norm, rel=1e-5)
        assert got.zero_fraction == exact.zero_fraction
        assert got.negative_fraction == exact.negative_fraction
        assert got.max == pytest.approx(exact.max, rel=1e-6)
        checked += g.numel() >= FAST_MIN
    assert checked >= 3  # the fast path ran
    # The relu's input gradient is the batch norm's output gradient: one measurement, both places.
    assert layers["2"].grad_input.norm == pytest.approx(layers["1"].grad_output.norm, rel=1e-12)
    assert rep.input_grad.norm == pytest.approx(float(xx.grad.double().norm()), rel=1e-5)


@pytest.mark.parametrize("name", list(_tensors()))
def test_native_rows_and_torchs_give_the_same_numbers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The native kernel's one read (where it builds) and torch's reductions: equal counts and
    bounds, the moments both within 1e-7 of the float64 values (both are near 1e-8)."""
    from inspect_model.methods import stats as stats_module
    from inspect_model.methods.activations import kernel

    t = _tensors()[name]
    native = fast_stats(t, t.shape[0])
    monkeypatch.setattr(stats_module, "_native_rows", lambda *a: None)
    plain = fast_stats(t, t.shape[0])
    assert native is not None and plain is not None
    a, b = native[0], plain[0]
    assert (a.min, a.max, a.zero_fraction, a.negative_fraction) == (b.min, b.max, b.zero_fraction, b.negative_fraction)
    exact = tensor_stats(t, exact=True)
    _close(a, exact, rel=1e-7)
    _close(b, exact, rel=1e-7)
    assert native[1] == pytest.approx(plain[1], rel=2e-7)
    if kernel.kernel() is not None:  # the native path ran: a NaN makes it step aside
        t = t.clone()
        t.view(-1)[7] = float("nan")
        assert stats_module._native_rows(t.reshape(-1), t.numel() // 32, 32) is None
