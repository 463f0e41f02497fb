"""Small user-facing fixes of issues 28 and 29, each reproduced through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


def _images(folder: Path, n: int = 3) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        p = folder / f"im{i}.png"
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(p)
        out.append(str(p))
    return out


# ----------------------------------------------------------------- issue 28.12
@pytest.mark.parametrize("command", ["cam", "grads", "guided-backprop"])
def test_top_k_above_the_class_count_warns_once(cli, models_py: Path, tmp_path: Path, command: str) -> None:
    """TinyCNN has 5 classes: top:100000 explains all 5 and says so in one warning, over
    three batches."""
    res = cli([command, f"{models_py}:TinyCNN", *_images(tmp_path), "--weights", "none", "--resize", "16",
               "--crop", "16", "--batch-size", "1", "--target", "top:100000", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    cut = [w for w in doc["warnings"] if "top:100000" in w["message"]]
    assert len(cut) == 1 and cut[0]["count"] == 1, doc["warnings"]
    assert "the model has 5" in cut[0]["message"] and "all 5" in cut[0]["message"]
    assert res.stderr.count("top:100000") == 1
    quiet = cli([command, f"{models_py}:TinyCNN", "--weights", "none", "--input-size", "3,16,16",
                 "--target", "top:5", "--json"])
    assert quiet.exit_code == 0 and not any("top:" in w["message"] for w in json.loads(quiet.stdout)["warnings"])


# ----------------------------------------------------------------- issue 29.6
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


# ----------------------------------------------------------------- issue 29.8: one tie-break
TIED = '''
import torch
from torch import nn


class Tied(nn.Module):
    """An untrained head initialised to zero (as torchvision's ViT): every class scores 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 1000)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.conv(x))).flatten(1))
'''


def test_tied_output_one_tie_break_everywhere(cli, tmp_path: Path) -> None:
    """Equal scores rank lowest class first (as argmax does) in the prediction list, the
    'predicted' and top:K targets of cam, grads and guided-backprop."""
    import torch

    from inspect_model.methods.objectives.targets import top_classes

    assert int(torch.zeros(1, 1000).argmax(1)) == 0  # the rule we follow: argmax's
    assert top_classes(torch.zeros(2, 1000), 5).tolist() == [[0, 1, 2, 3, 4]] * 2
    assert top_classes(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 3).tolist() == [[1, 2, 3]]
    p = tmp_path / "tied.py"
    p.write_text(TIED)
    base = [f"{p}:Tied", "--input-size", "3x8x8", "--weights", "none", "--json"]
    cam = json.loads(cli(["cam", *base, "--layer", "conv"]).stdout)
    rec = cam["images"][0]
    assert [q["class"] for q in rec["predictions"]] == [0, 1, 2, 3, 4]
    assert [m["target"]["class"] for m in rec["maps"]] == [0]
    top = json.loads(cli(["cam", *base, "--layer", "conv", "--target", "top:3"]).stdout)["images"][0]
    assert [m["target"]["class"] for m in top["maps"]] == [0, 1, 2]
    grads = json.loads(cli(["grads", *base, "--target", "top:2"]).stdout)
    assert grads["images"][0]["targets"] == [0, 1]
    guided = json.loads(cli(["guided-backprop", *base]).stdout)
    assert guided["images"][0]["targets"] == [0]


def test_predicted_line_uses_the_terminal_width() -> None:
    """On a 160-column terminal the "predicted:" line is one line, not wrapped to the table."""
    import io

    from rich.console import Console

    from inspect_model.render.cam_report import render_rich

    preds = [{"class": i, "label": f"class name number {i}", "probability": 0.1, "score": 1.0} for i in range(5)]
    payload = {"model": "m", "layers": [{"name": "conv", "kind": "nchw", "grid": [8, 8], "channels": 4}],
               "methods": ["gradcam"], "target": "predicted", "image_count": 1, "warnings": [],
               "images": [{"index": 0, "image": "cat.jpg", "predictions": preds, "maps": [
                   {"method": "gradcam", "layer": "conv", "warnings": [], "class_independent": False,
                    "raw_min": 0.0, "raw_max": 1.0, "target": preds[0]}]}]}
    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False, color_system=None)
    for part in render_rich(payload):  # as cli.common.emit prints them
        console.print(part, markup=False, highlight=False) if isinstance(part, str) else console.print(part)
    lines = [ln for ln in buf.getvalue().splitlines() if "predicted:" in ln]
    assert len(lines) == 1 and lines[0].rstrip().endswith("4 class name number 4 0.100"), buf.getvalue()


# ----------------------------------------------------------------- issue 29.8: top-level --help
def test_top_level_help_lists_exit_codes_one_a_line_and_whole_summaries(cli) -> None:
    from inspect_model import errors

    res = cli(["--help"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    start = lines.index("  Exit codes:")
    block = lines[start + 2:start + 2 + len(errors.EXIT_CODES)]
    assert [ln.split(None, 1)[0] for ln in block] == [f"{c}:" for c in errors.EXIT_CODES]  # no blank lines between
    assert all(ln.split(None, 1)[1] == errors.EXIT_CODES[int(ln.split(None, 1)[0][:-1])] for ln in block)
    from inspect_model import registry

    commands = " ".join(" ".join(lines[lines.index("Commands:") + 1:]).split())
    for spec in registry.COMMANDS.values():  # whole, never cut at "et al." (Click's first-sentence rule)
        assert f"{spec.name} {spec.summary}" in commands, spec.name
    assert "(Springenberg et al. 2015) for any ReLU network" in commands
