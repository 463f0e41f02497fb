"""The native one-read kernel of `activations` (methods/activations/kernel.py, native.py; issue
40): its numbers against float64 computed here, its build and cache refusing what it must
(another user's directory or library, no compiler, INSPECT_MODEL_NATIVE=0), no flush-to-zero
leaking into the process, and its reused buffers safe across threads and forks. The same
numbers as torch's path are checked case by case in test_activation_passes.py (both paths)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from inspect_model.methods.activations import kernel, native
from inspect_model.methods.activations.measure import measure

pytestmark = pytest.mark.skipif(kernel.kernel() is None, reason="no C compiler on this machine")


def _truth(t: torch.Tensor) -> list[tuple[float, float, float, float, int, int]]:
    out = []
    for img in t.double().reshape(t.shape[0], -1):
        mean = float(img.mean())
        out.append((mean, float(((img - mean) ** 2).sum()), float(img.min()), float(img.max()),
                    int((img == 0).sum()), int((img < 0).sum())))
    return out


def _check(t: torch.Tensor) -> None:
    m = measure(t, t.shape[0])
    assert isinstance(m.bounds, native.CellBounds)  # the native path measured it
    for s, (mean, m2, lo, hi, zeros, neg) in zip(m.samples, _truth(t)):
        assert (s.min, s.max, s.zeros, s.negatives) == (lo, hi, zeros, neg)
        spread = (m2 / s.count) ** 0.5
        assert s.mean == pytest.approx(mean, rel=1e-6, abs=1e-6 * spread + 1e-30)
        assert s.m2 == pytest.approx(m2, rel=1e-5, abs=1e-30)


@pytest.mark.parametrize("case", ["signed", "far_from_zero", "mostly_zero", "one_big_first", "tiny_cells",
                                  "long_rows", "constant", "tokens"])
def test_moments_equal_float64(case: str) -> None:
    g = torch.Generator().manual_seed(1)
    t = {
        "signed": lambda: torch.randn(3, 8, 20, 20, generator=g),
        "far_from_zero": lambda: torch.randn(2, 4, 30, 30, generator=g) * 1e-3 + 1e3,
        "mostly_zero": lambda: torch.relu(torch.randn(2, 4, 56, 56, generator=g) - 3),
        "one_big_first": lambda: torch.randn(2, 4, 30, 30, generator=g).index_put_(
            (torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([0])), torch.tensor(1e4)),
        "tiny_cells": lambda: torch.randn(4, 64, 4, 4, generator=g),
        "long_rows": lambda: torch.randn(2, 1, 300, 300, generator=g) * 3 + 1,  # blocks of 4,096
        "constant": lambda: torch.full((2, 3, 17, 17), 2.5),
        "tokens": lambda: torch.randn(2, 9, 40, generator=g),
    }[case]()
    _check(t)


def test_relu_in_place_is_read_like_any_output_and_equals_a_fresh_measurement() -> None:
    """A ReLU in place is read, not derived from its input's table: the same numbers whatever
    hooks surround it (offload, histograms), bit for bit those of the ReLU not in place."""
    from torch import nn

    from inspect_model.methods.activations.capture import ActivationCapture

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Conv2d(8, 4, 1)).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
    x = torch.randn(2, 3, 24, 24)
    calls: list[int] = []
    orig = kernel.cells

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return orig(*a, **k)

    cap = ActivationCapture(model, ["1", "2"])
    kernel.cells = counting  # type: ignore[assignment]
    try:
        with cap:
            got = cap.run(x)
    finally:
        kernel.cells = orig  # type: ignore[assignment]
    assert len(calls) == 2  # the BatchNorm output, then its ReLU's
    with torch.no_grad():
        want = torch.relu(model[1](model[0](x)))
    relu_rows = [lay for lay in got.images[1].layers if lay.key == "2"]
    s = relu_rows[0].stats
    mean, m2, lo, hi, zeros, neg = _truth(want)[1]
    assert (s.min, s.max, s.zero_fraction, s.negative_fraction) == (lo, hi, zeros / want[1].numel(), 0.0)
    assert s.mean == pytest.approx(mean, rel=1e-6)
    assert s.std == pytest.approx((m2 / (want[1].numel() - 1)) ** 0.5, rel=1e-5)
    plain = nn.Sequential(model[0], model[1], nn.ReLU(), model[3]).eval()
    with ActivationCapture(plain, ["1", "2"]) as cap2:
        fresh = cap2.run(x)
    assert [lay.stats for lay in fresh.images[1].layers if lay.key == "2"] == [lay.stats for lay in relu_rows]


def test_non_finite_values_leave_the_native_path() -> None:
    t = torch.randn(2, 3, 8, 8)
    t[1, 2, 3, 3] = float("inf")
    m = measure(t, 2)
    assert not isinstance(m.bounds, native.CellBounds)
    assert m.samples[1].inf == 1


def test_loading_the_library_sets_no_flush_to_zero() -> None:
    # -ffast-math links start-up code into a library that flushes subnormals process-wide
    assert kernel.kernel() is not None
    assert float(torch.tensor(1e-40) * 1.0) != 0.0
    assert 1e-310 * 1.0 != 0.0


def test_threads_measuring_at_once_get_their_own_numbers() -> None:
    g = torch.Generator().manual_seed(2)
    tensors = [torch.randn(2, 16, 32, 32, generator=g) * (i + 1) + i for i in range(4)]
    want = [_truth(t) for t in tensors]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(30):
                m = measure(tensors[i], 2)
                assert [(s.min, s.max, s.zeros) for s in m.samples] == [(w[2], w[3], w[4]) for w in want[i]]
                assert [s.mean for s in m.samples] == pytest.approx([w[0] for w in want[i]], rel=1e-6)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_measures_with_its_own_pool() -> None:
    t = torch.randn(2, 32, 64, 64)
    want = float(t[0].min())  # torch's own OpenMP pool may hang in a forked child: nothing of it there
    measure(t, 2)  # the parent's pool exists (two threads: rows split above 2^16 values)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            m = measure(t, 2)
            code = 0 if m.samples[0].min == want and isinstance(m.bounds, native.CellBounds) else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _fresh(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(kernel, "_state", {})


def test_built_into_a_private_cache_and_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh(monkeypatch, tmp_path)
    assert kernel.kernel() is not None
    libs = list(kernel.cache_dir().glob("stats-*.so"))
    assert len(libs) == 1 and not list(kernel.cache_dir().glob("*.c"))  # no leftovers
    assert kernel.cache_dir().stat().st_mode & 0o077 == 0
    monkeypatch.setattr(kernel, "_state", {})
    monkeypatch.setattr(kernel.subprocess, "run", lambda *a, **k: pytest.fail("compiled again"))
    assert kernel.kernel() is not None


def test_a_cache_others_may_write_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh(monkeypatch, tmp_path)
    kernel.cache_dir().mkdir(parents=True)
    kernel.cache_dir().chmod(0o777)
    assert kernel.kernel() is None
    kernel.cache_dir().chmod(0o700)
    monkeypatch.setattr(kernel, "_state", {})
    assert kernel.kernel() is not None
    lib = next(kernel.cache_dir().glob("stats-*.so"))
    lib.chmod(0o777)  # a library someone else could have replaced
    monkeypatch.setattr(kernel, "_state", {})
    assert kernel.kernel() is None


def test_no_compiler_or_turned_off_takes_torchs_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setattr(kernel.shutil, "which", lambda name: None)
    assert kernel.kernel() is None
    t = torch.randn(2, 3, 8, 8)
    m = measure(t, 2)
    assert not isinstance(m.bounds, native.CellBounds) and m.samples[0].min == float(t[0].min())
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("INSPECT_MODEL_NATIVE", "0")
    assert kernel.kernel() is None


def test_a_failing_compiler_takes_torchs_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh(monkeypatch, tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cc").write_text("#!/bin/sh\necho broken >&2\nexit 1\n")
    (fake / "cc").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    assert kernel.kernel() is None
    assert not list(kernel.cache_dir().glob("*"))  # nothing half-written left
