"""compare's schedule (methods/compare/exchange.py): B runs ahead of A within a byte budget.

A model whose matched outputs are many times the budget holds at most the budget (B waits
mid-forward and goes on as A frees), and its numbers are those of a run that holds all of B at
once; B's in-place ops (ReLU(inplace) after batch norm, ``out += identity``) never change a
held copy, or two identical models would not come out exactly equal."""

from __future__ import annotations

import torch
import torchvision

from inspect_model.engine.selection import select_layers
from inspect_model.methods.compare.passes import run_batches
from inspect_model.methods.compare.sides import EagerSide


def _resnet(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None, num_classes=10).eval()


def _run(a: torch.nn.Module, b: torch.nn.Module, budget: int):
    pairs = {n: n for n in select_layers(a)}
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return run_batches(a, EagerSide(b, pairs), [x, x.flip(-1)], lambda t: ((t,), {}), pairs, tolerance=1e-3,
                       low=None, budget=budget)


def _numbers(done) -> dict:
    return {n: (s.elements, s.sq_a, s.sq_b, s.sq_d, s.max_abs, s.beyond, s.calls) for n, s in done.sums.items()}


def test_memory_stays_within_the_budget_for_a_model_larger_than_it() -> None:
    a, b = _resnet(0), _resnet(0)
    unbounded = _run(a, b, budget=2**30)
    total = unbounded.peak_bytes  # all of B's matched outputs of one batch
    budget = 600_000  # > the largest single output (2x64x32x32 floats = 524,288 bytes)
    assert total > 8 * budget
    bounded = _run(a, b, budget=budget)
    assert 0 < bounded.peak_bytes <= budget < total
    assert bounded.peak < unbounded.peak == 60  # resnet18: 52 layers, ReLUs called twice per block
    assert bounded.memory(EagerSide(b, {})).budget_bytes == budget
    for done in (bounded, unbounded):
        assert len(done.sums) == 52
        assert all(s.sq_d == 0.0 and s.max_abs == 0.0 and s.elements > 0 for s in done.sums.values())


def test_a_budget_changes_no_number() -> None:
    a, b = _resnet(0), _resnet(0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in b.parameters():
            p.mul_(1 + 1e-3 * torch.randn(p.shape, generator=g))
    numbers = [_numbers(_run(a, b, budget=budget)) for budget in (2**30, 600_000, 1)]
    assert numbers[0] == numbers[1] == numbers[2]
    assert all(v[3] > 0 for v in numbers[0].values())  # every layer differs


def test_a_single_output_over_the_budget_is_held_alone() -> None:
    a, b = _resnet(0), _resnet(0)
    done = _run(a, b, budget=1)
    assert done.peak == 1 and done.peak_bytes == 2 * 64 * 32 * 32 * 4  # the largest output, alone
    assert all(s.sq_d == 0.0 for s in done.sums.values())
