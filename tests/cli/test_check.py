"""`inspect-model check`: PASS/FAIL lines, exit 1 on failure, JSON, and the Python function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import register_model
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


# ----------------------------------------------------------------- honest outputs (issue 14)
class DeadRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU()
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.bias.fill_(-1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.fc(x)) + x


def test_deterministic_counts_a_dead_layer_once(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, DeadRelu())
    res = cli(["check", spec, "--input-size", "4", "--weights", "none", "--deterministic"])
    assert res.exit_code == 1
    line = next(ln for ln in res.stdout.splitlines() if "dead layers" in ln)
    assert "dead layers: 1 " in line and line.endswith("(relu)"), line


def test_finite_outputs_says_non_finite_values(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    class Log(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x - 10.0)

    spec = register_model(monkeypatch, Log())
    res = cli(["check", spec, "--input-size", "5", "--weights", "none", "--max-dead-fraction", "1.0"])
    assert res.exit_code == 1
    assert "FAIL  finite outputs: 5 non-finite values (expected 0)" in res.stdout, res.stdout
    assert "finite outputs 5 non-finite values (expected 0)" in res.stderr, res.stderr


# ----------------------------------------------------------------- report numbers (issue 29.6)
def test_check_json_is_numeric_like_grads(cli, models_py: Path) -> None:
    import jsonschema

    from inspect_model.schemas import __file__ as schemas_init

    r = cli(["check", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--expect-output-shape", "1x5",
             "--expect-params", "1.5K", "--deterministic", "--max-seconds", "600", "--max-memory", "100000",
             "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, json.loads((Path(schemas_init).parent / "check.json").read_text()))
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["time"]["threshold"] == 600 and isinstance(checks["time"]["value"], float)
    assert checks["time"]["expected"] == {"min": None, "max": 600} and checks["time"]["expected_text"] == "<= 600"
    assert checks["memory"]["threshold"] == 100000
    assert checks["params"] == {**checks["params"], "value": 1493, "threshold": None,
                                "expected": {"min": 1450, "max": 1549}}
    assert checks["output shape"]["value"] == [1, 5] and checks["output shape"]["expected"] == [1, 5]
    assert checks["finite outputs"]["threshold"] == 0 and checks["finite gradients"]["expected"] is True
    assert checks["deterministic"]["threshold"] == 0.0
    for c in doc["checks"]:  # no comparison hidden in a string any more, except for humans
        assert not isinstance(c["expected"], str) and not isinstance(c["threshold"], str)


@pytest.mark.parametrize(("text", "passes"), [
    ("1.5K", True), ("1.49 K", True), ("1.49K", True), ("1493", True), ("1.4K", False), ("1K..2K", True),
    ("0.0015M", True), ("1.5k", True), ("2K", False),
])
def test_expect_params_takes_the_suffixes_the_tool_prints(cli, models_py: Path, text: str, passes: bool) -> None:
    """TinyCNN has 1,493 parameters; summary prints it as 1.49 K."""
    r = cli(["check", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--expect-params", text])
    assert r.exit_code == (0 if passes else 1), (text, r.stdout, r.stderr)


def test_expect_params_rounding_interval() -> None:
    from inspect_model.errors import UsageError
    from inspect_model.methods.checks.smoke import parse_count_range

    assert parse_count_range("11.7M") == (11_650_000, 11_749_999)  # resnet18's 11,689,512 passes
    assert parse_count_range("11.69 M") == (11_685_000, 11_694_999)
    assert parse_count_range("25M..26M") == (25_000_000, 26_000_000)
    assert parse_count_range("1.2G") == (1_150_000_000, 1_249_999_999)
    assert parse_count_range("25557032") == (25_557_032, 25_557_032)
    for bad in ("11.7X", "M", "1..0"):
        with pytest.raises(UsageError):
            parse_count_range(bad)
