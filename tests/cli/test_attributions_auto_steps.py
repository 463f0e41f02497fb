"""``attributions --steps auto`` (issue 40): each integrated-gradients map takes the fewest
Gauss-Legendre steps (4, 8, 16, ...) whose completeness gap is within ``--max-gap`` of
|f(x) - f(baseline)|; the map is the fixed-steps map at the steps it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from inspect_model.methods.attributions.maps import AttributionSettings, attribute

COMMON = ["--input-size", "3x16x16", "--batch-size", "2", "-q"]


class Curved(nn.Module):
    """Scores far from linear along the path (tanh of a large product): few steps miss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(3 * self.lin(x)) * 4 + torch.sin(2 * self.lin(x))


def _ig(model: nn.Module, x: torch.Tensor, target: list[int], steps: int | str, gap: float = 1e-3):  # noqa: ANN202
    st = AttributionSettings(methods=("integrated-gradients",), steps=steps, max_gap=gap, batch_size=7)
    return attribute(model, x, target, st)


def test_auto_steps_meet_the_gap_with_the_maps_of_their_step_count() -> None:
    model = Curved().eval()
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(1)) * 2
    target = [0, 1, 2, 0, 1]
    auto = _ig(model, x, target, "auto", gap=1e-4)
    used = [row[0] for row in auto.ig_steps]
    assert min(used) >= 4 and len(set(used)) >= 2, used  # some maps need more steps than others
    for i, s in enumerate(used):
        rel = abs(auto.deltas[i][0]) / abs(auto.scores[i][0] - auto.baseline_scores[i][0])
        assert rel <= 1e-4 or s == 256
        fixed = _ig(model, x[i:i + 1], [target[i]], s)
        torch.testing.assert_close(auto.maps["integrated-gradients"][i], fixed.maps["integrated-gradients"][0])
        assert fixed.deltas[0][0] == pytest.approx(auto.deltas[i][0], abs=1e-5)  # float32 rounding
    # A coarser tolerance never takes more steps.
    loose = _ig(model, x, target, "auto", gap=1e-1)
    assert all(a[0] <= b for a, b in zip(loose.ig_steps, used))


def test_fixed_steps_report_their_count() -> None:
    model = Curved().eval()
    x = torch.randn(2, 12)
    assert _ig(model, x, [0, 1], 6).ig_steps == [[6], [6]]


def test_cli_reports_steps_and_tolerance(cli, models_py: Path) -> None:  # noqa: ANN001
    import jsonschema

    from inspect_model.schemas import load_schema

    r = cli(["attributions", f"{models_py}:TinyCNN", *COMMON, "-m", "ig", "--steps", "auto", "--max-gap", "0.01",
             "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("attributions")).validate(doc)
    for e in doc["images"]:
        for m in e["maps"]:
            assert m["gap_tolerance"] == 0.01 and m["steps"] in (4, 8, 16, 32, 64, 128, 256)
            assert m["relative_gap"] <= 0.01 or m["steps"] == 256
    assert doc["options"]["steps"] == "auto"
    fixed = json.loads(cli(["attributions", f"{models_py}:TinyCNN", *COMMON, "-m", "ig", "--steps", "8",
                            "--json"]).stdout)
    assert all(m["steps"] == 8 and "gap_tolerance" not in m for e in fixed["images"] for m in e["maps"])


@pytest.mark.parametrize(("extra", "message"), [
    (["--steps", "many"], "error: --steps 'many': give a number of steps (32) or auto"),
    (["--steps", "auto", "--max-gap", "0"],
     "error: --max-gap 0.0: give a relative completeness gap above 0 (0.001 is 0.1 %)"),
    (["--steps", "auto", "--smooth"], "error: --steps auto judges each map by its completeness gap, which noise "
     "samples blur; give a number of steps with --smooth"),
])
def test_bad_auto_options_are_usage_errors(cli, models_py: Path, extra: list[str], message: str) -> None:  # noqa: ANN001
    r = cli(["attributions", f"{models_py}:TinyCNN", *COMMON, "-m", "ig", *extra])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [message]
