"""compare's native kernel (methods/compare/kernel.py) against torch's path of PairSums and
against float64 by hand: the same sums (to float32 rounding), the same max and counts
exactly, exact zeros for an identical pair, NaN/Inf to the careful path, the streaming copy
bit for bit; off (INSPECT_MODEL_NATIVE=0) or without a compiler, torch's path."""

from __future__ import annotations

import pytest
import torch

from inspect_model.methods.activations import kernel as build
from inspect_model.methods.compare import kernel, stats
from inspect_model.methods.compare.stats import PairSums, Scratch

SIZES = (1, 4095, 4097, 300_000)  # a partial block, one past a block, several threads' worth


def _torch_sums(a: torch.Tensor, b: torch.Tensor, tol: float, low: torch.dtype | None = None) -> PairSums:
    s = PairSums()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stats, "pair", lambda *args: None)
        s.add(a, b, tol, low, Scratch())
    return s


@pytest.mark.parametrize("n", SIZES)
def test_kernel_numbers_equal_torchs_and_float64s(n: int) -> None:
    assert kernel.pair(torch.ones(2), torch.ones(2), 1e-3, None) is not None  # a compiler is here: the kernel runs
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=g) * 3
    b = a * (1 + 2e-3 * torch.randn(n, generator=g))
    got, want = PairSums(), _torch_sums(a, b, 1e-3)
    got.add(a, b, 1e-3)
    d, a64, b64 = (a - b).double(), a.double(), b.double()
    for x, truth in ((got.sq_d, d @ d), (got.sq_a, a64 @ a64), (got.sq_b, b64 @ b64)):
        assert x == pytest.approx(float(truth), rel=1e-6)
    # float64's truth to 1e-6; torch's path sums in float32 (its rounding depends on the thread
    # count: 2e-6 apart at 300,000 elements on one thread)
    assert got.relative_error() == pytest.approx(float((d @ d).sqrt() / (a64 @ a64).sqrt()), rel=1e-6)
    assert got.relative_error() == pytest.approx(want.relative_error(), rel=1e-5)
    assert 1 - got.cosine() == pytest.approx(1 - want.cosine(), rel=1e-4)
    assert got.max_abs == want.max_abs == float((a - b).abs().max())
    assert got.beyond == want.beyond == int(((a - b).abs() - 1e-3 * a.abs() > 1e-3).sum())
    assert got.elements == n


@pytest.mark.parametrize(("low", "lo", "hi"), [(torch.float16, -9, 5.5), (torch.bfloat16, -40, 38.5)])
def test_identical_pairs_are_exact_zeros_and_range_counts_equal_torchs(low: torch.dtype, lo: float, hi: float) -> None:
    g = torch.Generator().manual_seed(3)  # bfloat16's range: squares overflow float32, the careful path counts
    a = torch.randn(70_000, generator=g) * torch.logspace(lo, hi, 70_000)
    got, want = PairSums(), _torch_sums(a, a.clone(), 1e-3, low)
    got.add(a, a.clone(), 1e-3, low)
    assert (got.sq_d, got.max_abs, got.beyond, got.relative_error(), got.cosine()) == (0.0, 0.0, 0, 0.0, 1.0)
    assert (got.overflow, got.underflow) == (want.overflow, want.underflow) and got.overflow > 0 and got.underflow > 0


def test_nonfinite_elements_take_the_careful_path() -> None:
    a = torch.randn(5000)
    b = a.clone()
    b[7], b[9] = float("nan"), float("inf")
    s = PairSums()
    s.add(a, b, 1e-3, torch.float16)
    assert s.nonfinite_b == 2 and s.nonfinite_a == 0 and s.elements == 4998 and s.relative_error() == 0.0


def test_streaming_copy_is_exact_at_any_alignment() -> None:
    n = kernel.STREAM_MIN + 33
    src = torch.randn(n)
    for offset in (0, 1, 3):
        out = torch.empty(n + offset)[offset:]
        assert kernel.copy(out, src) and torch.equal(out, src)
    assert not kernel.copy(torch.empty(10), torch.ones(10))  # small: torch's copy
    assert not kernel.copy(torch.empty(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64))


def test_turned_off_takes_torchs_path(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("INSPECT_MODEL_NATIVE", "0")
    monkeypatch.setattr(build, "_state", {})
    monkeypatch.setattr(kernel, "_lib", [])
    a = torch.randn(5000)
    n = kernel.STREAM_MIN
    assert kernel.pair(a, a, 1e-3, None) is None and not kernel.copy(torch.empty(n), torch.ones(n))
    s = PairSums()
    s.add(a, a * 1.01, 1e-3)
    assert s.relative_error() == pytest.approx(0.01, rel=1e-5)
    assert not list(tmp_path.rglob("*.so"))
