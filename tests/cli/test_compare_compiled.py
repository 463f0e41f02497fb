"""``compare --against compiled|export`` on resnet18 (random weights): every layer within
float32 rounding. The tolerance stated: a relative error ||a-b||/||a|| of at most 1e-5 per
layer (measured: export 0, exactly the eager kernels; torch.compile up to ~1e-6, its fused
kernels reorder the sums). torch.compile on a CPU needs a C++ compiler and compiles for tens
of seconds here: slow tier."""

from __future__ import annotations

import shutil

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
