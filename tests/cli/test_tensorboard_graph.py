"""The model's graph in TensorBoard (issue 14): written where the model traces, a note where not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import assert_same, register_model, snapshot
from fixtures.models import TinyCNN

pytest.importorskip("tensorboard")


def test_grads_tensorboard_writes_the_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    from inspect_model.output.tensorboard import graph_written

    model = TinyCNN().train()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli(["grads", spec, "--weights", "none", "--input-size", "3x8x8", "--tensorboard", str(tmp_path / "tb"),
               "--json"])
    assert res.exit_code == 0, res.stderr
    assert graph_written(tmp_path / "tb")
    assert_same(model, before)


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if float(x.sum()) > -1e9 else self.fc(-x)  # data-dependent: no trace? see below


def test_a_failed_trace_is_a_note() -> None:
    from inspect_model.output.tensorboard import write_graph

    class Writer:
        def add_graph(self, *a, **k):  # type: ignore[no-untyped-def]
            raise RuntimeError("cannot trace")

    note = write_graph(Writer(), Untraceable(), torch.randn(1, 4))
    assert note is not None and "graph was not written (tracing failed: RuntimeError: cannot trace)" in note


def test_the_graph_trace_is_not_counted_as_a_batch(tmp_path: Path) -> None:
    """The trace runs the model once more: no hook may record it (activations' statistics
    and image counts with --tensorboard equal those without)."""
    import inspect_model as im

    model = TinyCNN().eval()
    x = torch.randn(3, 3, 8, 8)
    plain = im.activations(model, x).to_dict()
    with_tb = im.activations(model, x, tensorboard=tmp_path / "tb").to_dict()
    assert with_tb["image_count"] == plain["image_count"] == 3
    assert [r["stats"] for r in with_tb["layers"]] == [r["stats"] for r in plain["layers"]]
    assert [r["calls"] for r in with_tb["layers"]] == [r["calls"] for r in plain["layers"]]


def test_summary_tensorboard_writes_the_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    from inspect_model.output.tensorboard import graph_written

    model = TinyCNN().train()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli(["summary", spec, "--input-size", "3x8x8", "--tensorboard", str(tmp_path / "tb"), "--json"])
    assert res.exit_code == 0, res.stderr
    assert graph_written(tmp_path / "tb")
    assert "warning" not in res.stderr  # torch.jit.trace's deprecation is not the user's business
    assert_same(model, before)


def test_summary_tensorboard_notes_a_failed_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    class TupleIn(nn.Module):  # a trace cannot take a dict output with a non-tensor value
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> dict[str, object]:
            return {"y": self.fc(x), "tag": "not a tensor"}

    spec = register_model(monkeypatch, TupleIn())
    res = cli(["summary", spec, "--input-size", "4", "--tensorboard", str(tmp_path / "tb"), "--json"])
    assert res.exit_code == 0, res.stderr
    assert "note: TensorBoard: the model's graph was not written (tracing failed" in res.stderr
