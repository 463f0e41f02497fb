"""Summary on models that used to break it (issue 14): recurrent layers counted the same
on every device, and an op the MAC counter has no formula for marked on its row."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inspect_model as im


def _analytic(mode_gates: int, inp: int, hidden: int, layers: int, dirs: int, steps: int, proj: int = 0) -> int:
    rec = proj or hidden
    total = 0
    for layer in range(layers):
        i = inp if layer == 0 else rec * dirs
        total += (mode_gates * hidden * (i + rec) + hidden * proj) * dirs
    return total * steps


@pytest.mark.parametrize(("cls", "gates"), [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
def test_recurrent_macs_are_the_same_on_every_device(cls: type, gates: int) -> None:
    model = cls(16, 24, num_layers=2, batch_first=True, bidirectional=True)
    expected = _analytic(gates, 16, 24, 2, 2, steps=2 * 7)
    for device in ("meta", "cpu"):
        res = im.summary(model, input_size=["7x16"], batch_size=2, device=device)
        assert res.total_macs == expected, (device, res.total_macs)
        assert not any(r.unknown_cost_ops for r in res.rows)


def test_lstm_with_projection() -> None:
    model = nn.LSTM(10, 20, proj_size=5)
    expected = _analytic(4, 10, 20, 1, 1, steps=3, proj=5)
    assert im.summary(model, input_size=["3x10"], device="cpu").total_macs == expected
    assert im.summary(model, input_size=["3x10"]).total_macs == expected


@torch.library.custom_op("inspect_model_test::fused_matmul", mutates_args=())
def _fused_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


@_fused_matmul.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


class Opaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fused_matmul(x, self.w)


def test_an_op_of_unknown_cost_is_marked_on_its_row() -> None:
    model = nn.Sequential(nn.Linear(8, 8), Opaque())
    res = im.summary(model, input_size=["8"], device="cpu")
    row = {r.name: r for r in res.rows}["1"]
    assert row.macs == 0 and row.unknown_cost_ops == ("inspect_model_test.fused_matmul",)
    assert {r.name: r for r in res.rows}["0"].unknown_cost_ops == ()
    assert any("MACs unknown for inspect_model_test.fused_matmul in '1'" in n for n in res.notes)
    text = res.render_text(res) if hasattr(res, "render_text") else str(res)
    doc = res.to_dict()
    layer = next(x for x in doc["layers"] if x["name"] == "1")
    assert layer["unknown_cost_ops"] == ["inspect_model_test.fused_matmul"]
    assert text
