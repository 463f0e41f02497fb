"""`inspect-model check`: PASS/FAIL lines, exit 1 on failure, JSON, and the Python function."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from fixtures.models import TinyCNN, assert_unchanged, model_state
from inspect_model.engine.selection import select_layers
from inspect_model.methods.checks.smoke import parse_count_range, run_checks


def test_all_checks_pass_on_healthy_model(cli, models_py: Path) -> None:
    r = cli(["check", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--expect-output-shape", "1x5",
             "--expect-params", "1493", "--deterministic", "--max-seconds", "600", "--max-memory", "100000"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "8 passed, 0 failed"
    assert all(line.startswith("PASS") for line in lines[:-1])


def test_failed_check_exits_1_with_one_line_reason(cli, models_py: Path) -> None:
    r = cli(["check", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--expect-output-shape", "1x10",
             "--expect-params", "10..20"])
    assert r.exit_code == 1
    assert "FAIL  output shape: 1x5 (expected 1x10)" in r.stdout
    assert "FAIL  params: 1493 (expected 10..20)" in r.stdout
    assert r.stderr.strip().splitlines() == [
        "error: check failed: params 1493 (expected 10..20); output shape 1x5 (expected 1x10)"
    ]


def test_json_lists_every_check(cli, models_py: Path) -> None:
    r = cli(["check", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--expect-params", "1e3..2e3", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["command"] == "check" and doc["passed"] is True
    names = [c["name"] for c in doc["checks"]]
    assert names == ["params", "finite outputs", "finite gradients", "dead layers"]


def test_non_finite_output_and_dead_layer_fail() -> None:
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.relu = nn.ReLU()
            self.log = Log()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.log(self.relu(self.fc(x)) - 1.0)

    class Log(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x)

    m = Bad()
    with torch.no_grad():
        m.fc.weight.zero_()
        m.fc.bias.fill_(-1.0)  # relu output all zero: a dead layer; log(-1) is NaN
    before = model_state(m)
    res = {r.name: r for r in run_checks(m, (torch.randn(3, 4),), layers=select_layers(m))}
    assert not res["finite outputs"].passed and res["finite outputs"].value == 12
    assert res["finite outputs"].detail == "first non-finite layer: log"
    assert not res["dead layers"].passed and "relu" in res["dead layers"].detail
    assert_unchanged(m, before)


def test_nondeterministic_model_fails_determinism() -> None:
    class Noisy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.rand_like(x)

    res = {r.name: r for r in run_checks(Noisy(), (torch.zeros(1, 3),), layers=[""], deterministic=True)}
    assert not res["deterministic"].passed and res["deterministic"].value > 0


def test_count_range_parsing() -> None:
    assert parse_count_range("25557032") == (25557032, 25557032)
    assert parse_count_range("25e6..26e6") == (25_000_000, 26_000_000)
    assert parse_count_range("1_000..") [0] == 1000


def test_check_leaves_model_unchanged_and_grads_none() -> None:
    m = TinyCNN()
    before = model_state(m)
    run_checks(m, (torch.randn(2, 3, 8, 8),), layers=select_layers(m), deterministic=True)
    assert_unchanged(m, before)
    assert all(p.grad is None for p in m.parameters())
