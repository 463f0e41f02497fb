"""``compare --against compiled|export`` on resnet18 (random weights): every layer within
float32 rounding. The tolerance stated: a relative error ||a-b||/||a|| of at most 1e-5 per
layer (measured: export 0, exactly the eager kernels; torch.compile up to ~1e-6, its fused
kernels reorder the sums). torch.compile on a CPU needs a C++ compiler and compiles for tens
of seconds here: slow tier."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision

import inspect_model as im
from fixtures.models import assert_unchanged, model_state

FLOAT32_ROUNDING = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("way", ["export", "compiled"])
def test_resnet18_compiled_and_exported_within_float32_rounding(way: str) -> None:
    if way == "compiled" and shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    before = model_state(model)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    res = im.compare(model, x, against=way, tolerance=FLOAT32_ROUNDING, fail_above=FLOAT32_ROUNDING)
    assert_unchanged(model, before)
    assert res.matched == 52 and len(res.layers) == 52
    assert all(r.status in ("equal", "within") for r in res.layers), [(r.name, r.relative_error) for r in res.layers]
    assert max(r.relative_error for r in res.layers) <= FLOAT32_ROUNDING
    assert res.passed and res.first_divergent is None
    assert res.outputs[0].top1_agreement == 1.0
    if way == "export":
        assert all(r.status == "equal" for r in res.layers)  # the same aten kernels, node by node
        assert res.memory.mode == "ahead" and res.memory.peak_outputs == 60  # all of B within the budget
    else:
        assert res.memory.mode == "cached"


@pytest.mark.slow
def test_compiled_cli_prints_only_its_own_output(tmp_path) -> None:
    """A cold torch.compile (its own cache folder) from the shell: the report on stdout and
    nothing on stderr: no torch log line ("No CUDA runtime is found"), no "left thread(s)
    running" warning for inductor's compile threads. A smaller fixture than TinyCNN that compiles
    kernels (Linear, ReLU, Linear: 7 of them cold, against TinyCNN's 9): every compile is cold
    here, and what is checked is the command's output, not the model's layers."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=os.pathsep.join([str(root / "src"), str(root / "tests"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "inspect_model", "compare", f"{root / 'tests/fixtures/models.py'}:TwoLayer",
                        "--input-size", "3", "--against", "compiled"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "memory: cached" in r.stdout and "fc2" in r.stdout
