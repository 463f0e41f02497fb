"""compare's maths against independent computations: the per-layer numbers of a pair
(float64 by hand), layer matching, the --map file's checks, and the exchange (B runs
ahead within its byte budget, no deadlock when B's order differs; see also
test_compare_budget.py)."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch
from torch import nn

from inspect_model.errors import InputError, UsageError
from inspect_model.methods.compare.exchange import Exchange
from inspect_model.methods.compare.match import match_layers, read_map
from inspect_model.methods.compare.stats import PairSums


def test_pair_sums_equal_the_formulas_over_two_batches() -> None:
    g = torch.Generator().manual_seed(1)
    a1, a2 = torch.randn(4, 5, generator=g), torch.randn(3, 5, generator=g)
    b1, b2 = a1 + 0.01 * torch.randn(4, 5, generator=g), a2 * 1.5
    s = PairSums()
    s.add(a1, b1, 1e-2)
    s.add(a2, b2, 1e-2)
    a = torch.cat([a1, a2]).double().flatten()
    b = torch.cat([b1, b2]).double().flatten()
    d = a - b
    assert s.relative_error() == pytest.approx(float(d.norm() / a.norm()), rel=1e-6)
    assert s.cosine() == pytest.approx(float(a @ b / (a.norm() * b.norm())), rel=1e-6)
    assert s.max_abs == pytest.approx(float(d.abs().max()), rel=1e-6)
    beyond = (d.abs() > 1e-2 + 1e-2 * a.abs()).double().mean()
    assert s.beyond_share() == pytest.approx(float(beyond))
    assert s.calls == 2


def test_identical_tensors_give_exact_zeros_and_range_counts() -> None:
    a = torch.tensor([1e5, -7e4, 1e-6, 0.0, 3.0, 1e-9])
    s = PairSums()
    s.add(a, a.clone(), 1e-3, torch.float16)
    assert (s.relative_error(), s.max_abs, s.cosine(), s.beyond_share()) == (0.0, 0.0, 1.0, 0.0)
    # float16: largest finite 65504, smallest normal 2**-14 ~ 6.1e-5
    assert s.overflow == 2 and s.underflow == 2


def test_nonfinite_elements_are_counted_and_left_out() -> None:
    a = torch.tensor([1.0, 2.0, 3.0])
    b = torch.tensor([1.0, float("inf"), float("nan")])
    s = PairSums()
    s.add(a, b, 1e-3)
    assert s.nonfinite_b == 2 and s.nonfinite_a == 0 and s.elements == 1 and s.relative_error() == 0.0


def test_match_by_name_then_order_and_shape_then_map(tmp_path) -> None:
    a = nn.Sequential()
    a.add_module("stem", nn.Conv2d(3, 4, 3))
    a.add_module("act", nn.ReLU())
    a.add_module("head", nn.Linear(4, 2))
    b = nn.Sequential()
    b.add_module("stem", nn.Conv2d(3, 4, 3))
    b.add_module("relu", nn.ReLU())
    b.add_module("classifier", nn.Linear(4, 2))
    b.add_module("extra", nn.Linear(2, 2))
    am, bm = dict(a.named_modules()), dict(b.named_modules())
    m = match_layers(["stem", "act", "head"], am, ["stem", "relu", "classifier", "extra"], bm)
    assert m.pairs == {"stem": "stem", "act": "relu", "head": "classifier"}
    assert m.how == {"stem": "name", "act": "order", "head": "order"}
    assert m.unmatched_b == ("extra",) and m.unmatched_a == ()
    m = match_layers(["stem", "act", "head"], am, ["stem", "relu", "classifier", "extra"], bm, {"head": "extra"})
    assert m.pairs["head"] == "extra" and m.how["head"] == "map" and "classifier" in m.unmatched_b
    with pytest.raises(UsageError, match="'nope' is not a layer of B"):
        match_layers(["stem"], am, ["stem"], bm, {"stem": "nope"})


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "one JSON object"), ('{"a": 1}', "one JSON object"), ("{not json", "is not JSON"),
    ('{"a": "x", "b": "x"}', "same layer of B")])
def test_map_file_is_checked(tmp_path, text: str, message: str) -> None:
    p = tmp_path / "map.json"
    p.write_text(text)
    with pytest.raises(InputError, match=message):
        read_map(p)


def test_map_file_size_is_bounded(tmp_path) -> None:
    p = tmp_path / "map.json"
    p.write_text(json.dumps({f"a{i}": f"b{i}" for i in range(80_000)}))
    with pytest.raises(InputError, match="over the 1.0 MiB"):
        read_map(p)


def _exchange_run(b_order: list[str], a_order: list[str], budget: int = 2**20
                  ) -> tuple[list[tuple[str, float]], Exchange]:
    a_may_start = threading.Event()  # as in run_pair: A starts when B is done or at the budget
    ex = Exchange(budget=budget, on_full=a_may_start.set)
    got: list[tuple[str, float]] = []

    def run_b() -> None:
        for i, name in enumerate(b_order):
            ex.put((name, 0), torch.tensor([float(i)]))
        ex.finish("b")
        a_may_start.set()

    t = threading.Thread(target=run_b)
    t.start()
    assert a_may_start.wait(timeout=10)
    for name in a_order:
        v = ex.take((name, 0))
        got.append((name, float(v) if v is not None else math.nan))
    ex.finish("a")
    t.join(timeout=10)
    assert not t.is_alive()
    return got, ex


def test_exchange_lets_b_run_ahead_within_its_budget() -> None:
    got, ex = _exchange_run(["x", "y", "z"], ["x", "y", "z"])
    assert got == [("x", 0.0), ("y", 1.0), ("z", 2.0)] and ex.peak == 3 and ex.peak_bytes == 12
    got, ex = _exchange_run(["x", "y", "z"], ["x", "y", "z"], budget=8)  # two 4-byte outputs at most
    assert got == [("x", 0.0), ("y", 1.0), ("z", 2.0)] and ex.peak == 2 and ex.peak_bytes == 8
    got, ex = _exchange_run(["x", "y", "z"], ["x", "y", "z"], budget=1)  # one output alone is over it: one at a time
    assert got == [("x", 0.0), ("y", 1.0), ("z", 2.0)] and ex.peak == 1


def test_exchange_lets_b_run_ahead_when_its_order_differs() -> None:
    got, ex = _exchange_run(["x", "y", "z"], ["z", "x", "y"], budget=4)  # past the budget: A waits for z
    assert got == [("z", 2.0), ("x", 0.0), ("y", 1.0)] and ex.peak == 3
