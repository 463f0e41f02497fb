"""methods/meta_norms.py: batch, layer and group norm on the meta device, made without torch's
Python decompositions, equal to torch's own meta outputs (shape, dtype, strides) in every
layout, dtype, mode and overload; a call torch refuses still reaches torch; a summary is the
same with and without them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspect_model.methods import meta_norms, summary
from inspect_model.methods.meta_norms import meta_norm

aten = torch.ops.aten
LOW = (torch.float16, torch.bfloat16)


def _cases(shape: tuple[int, ...], channels_last: bool, dtype: torch.dtype) -> list[tuple]:
    x = torch.empty(shape, device="meta", dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.empty(8, device="meta", dtype=dtype), torch.empty(8, device="meta", dtype=dtype)
    rm = torch.empty(8, device="meta", dtype=torch.float32 if dtype in LOW else dtype)
    rv = rm.clone()
    out = []
    for training in (True, False):
        out += [(aten.native_batch_norm.default, (x, w, b, rm, rv, training, 0.1, 1e-5)),
                (aten._native_batch_norm_legit.default, (x, w, b, rm, rv, training, 0.1, 1e-5)),
                (aten._native_batch_norm_legit.no_stats, (x, w, b, training, 0.1, 1e-5)),
                (aten.native_batch_norm.default, (x, None, None, None, None, training, 0.1, 1e-5))]
    out.append((aten._native_batch_norm_legit_no_training.default, (x, w, b, rm, rv, 0.1, 1e-5)))
    hw = int(torch.tensor(shape[2:]).prod()) if len(shape) > 2 else 1
    out += [(aten.native_group_norm.default, (x, w, b, shape[0], 8, hw, g, 1e-5)) for g in (1, 2, 4, 8, 3)]
    for k in range(1, len(shape) + 1):
        ns = list(shape[-k:])
        out += [(aten.native_layer_norm.default, (x, ns, torch.empty(ns, device="meta", dtype=dtype), None, 1e-5)),
                (aten.native_layer_norm.default, (x, ns, None, None, 1e-5))]
    out.append((aten.native_layer_norm.default, (x, [5, 5, 5], None, None, 1e-5)))  # not the input's tail
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize(("shape", "channels_last"), [((2, 8, 5, 5), False), ((2, 8, 5, 5), True), ((2, 8, 7), False),
                                                       ((2, 8, 3, 4, 5), False), ((2, 8), False), ((1, 8, 1, 1), True),
                                                       ((1, 8), False)])
def test_outputs_equal_torchs_meta_outputs(shape: tuple[int, ...], channels_last: bool, dtype: torch.dtype) -> None:
    made = 0
    for func, args in _cases(shape, channels_last, dtype):
        try:
            want = func(*args)
        except Exception:  # torch refuses (eval without running statistics, one value per channel...)
            want = None
        got = meta_norm(func, args, {})
        if got is None:
            continue  # torch runs it: the same by construction
        assert want is not None, (func, shape, dtype)  # never an answer where torch raises
        made += 1
        for g, w in zip(got, want, strict=True):
            assert (g.shape, g.dtype, g.stride(), g.device) == (w.shape, w.dtype, w.stride(), w.device), (func, shape)
    assert made >= 10


def test_other_devices_and_ops_go_to_torch() -> None:
    x = torch.zeros(2, 8, 4, 4)
    w = torch.ones(8)
    assert meta_norm(aten.native_batch_norm.default, (x, w, w, w, w, False, 0.1, 1e-5), {}) is None  # CPU
    m = x.to("meta")
    assert meta_norm(aten.relu.default, (m,), {}) is None
    assert meta_norm(aten.native_layer_norm.default, (m, [4]), {"eps": 1e-5}) is None  # keywords: torch


class _Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(4, 8)
        self.ln = nn.LayerNorm([8, 6, 6])
        self.fc = nn.Linear(8 * 36, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.ln(self.gn(self.bn(self.conv(x)))).flatten(1))


@pytest.mark.parametrize("train", [False, True])
def test_summary_is_the_same_without_them(monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    model = _Norms().train(train)
    x = torch.empty(2, 3, 6, 6, device="meta")
    calls = []
    real = meta_norms.meta_norm
    monkeypatch.setattr(summary, "meta_norm", lambda *a: calls.append(1) or real(*a))
    model = model.to("meta")
    fast = summary.summarize(model, (x,), train=train)
    assert len(calls) >= 3 and fast.total_macs > 0 and fast.error is None
    monkeypatch.setattr(summary, "meta_norm", lambda *a: None)
    slow = summary.summarize(model, (x,), train=train)
    assert fast == slow
