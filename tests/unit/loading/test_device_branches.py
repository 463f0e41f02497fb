"""Code paths that branch on the device, run on the CPU by forcing the branch: what a user
with a GPU (or an Apple MPS device) would go through, with nothing to configure. The
accelerator order of the activation statistics is in tests/cli/test_activations.py; Score-CAM's
memory budget in tests/cli/test_scorecam_batching.py; the benchmark suite's synchronisation in
tests/e2e/test_benchmarks.py."""

from __future__ import annotations

import pytest
import torch

from inspect_model.run.options import resolve_device
from inspect_model.errors import UsageError
from inspect_model.methods.faithfulness import metrics as fa


def fake_gpus(monkeypatch: pytest.MonkeyPatch, n: int, mps: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 2)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(UsageError, match=r"no such CUDA device \(found 2\)"):
        resolve_device("cuda:2")
    fake_gpus(monkeypatch, 0, mps=True)
    assert resolve_device("auto") == "mps" and resolve_device("mps") == "mps"
    fake_gpus(monkeypatch, 0)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(UsageError, match="MPS is not available"):
        resolve_device("mps")


def test_benchmark_suite_picks_cuda_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import run

    fake_gpus(monkeypatch, 1)
    assert run.pick_device(None).type == "cuda"
    assert run.pick_device("cpu").type == "cpu"
    fake_gpus(monkeypatch, 0)
    assert run.pick_device(None).type == "cpu"


def test_imputation_thread_count_is_given_back() -> None:
    """On a CPU the solve runs on one thread; the caller's thread count comes back, also when
    the solve fails."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(3, 12, 12)
        fa.impute(x, torch.rand(2, 12, 12) < 0.5)
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError):
            fa.impute(torch.randn(3, 12, 12), torch.rand(2, 11, 12) < 0.5)  # masks of another size
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
