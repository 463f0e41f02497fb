"""Progress of the long inner loops (issue 15): Score-CAM's masked passes, the sanity
check's randomised models and grads' per-layer work report (done, total, label)."""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

import inspect_model as im


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 5, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 4)).eval()


class Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str | None]] = []

    def __call__(self, done: int, total: int, label: str | None = None) -> None:
        assert label is None or 0 < done <= total
        self.calls.append((done, total, label))

    def of(self, label: str) -> list[tuple[int, int]]:
        return [(d, t) for d, t, lab in self.calls if lab == label]


def test_scorecam_reports_every_masked_pass() -> None:
    calls = Calls()
    x = torch.randn(2, 3, 8, 8)
    r = im.cam(_net(), x, methods=["scorecam"], layers=["2"], scorecam_batch=2, progress=calls)
    passes = calls.of("scorecam: masked forward passes")
    assert passes == [(i, 5) for i in range(1, 6)]  # ceil(2 images x 5 channels / 2): across images
    assert r.to_dict()["passes"]["scorecam_forward"] == 5


def test_sanity_check_reports_each_randomised_model() -> None:
    calls = Calls()
    im.guided_backprop(_net(), torch.randn(1, 3, 8, 8), sanity=True, progress=calls)
    steps = calls.of("sanity: randomised models")
    assert steps and steps[-1][0] == steps[-1][1] and [d for d, _ in steps] == list(range(1, len(steps) + 1))


def test_grads_reports_layers_and_parameters() -> None:
    calls = Calls()
    im.grads(_net(), torch.randn(2, 3, 8, 8), progress=calls)
    layers = calls.of("grads: layer gradients")
    params = calls.of("grads: parameter gradients")
    assert layers and layers[-1][0] == layers[-1][1]
    assert params == [(i, 6) for i in range(1, 7)]  # 3 weights and 3 biases


def test_cli_bar_has_one_task_per_label(monkeypatch: Any) -> None:
    from inspect_model.cli import progress as mod
    from inspect_model.cli.console import Messages

    monkeypatch.setattr(mod, "_stderr_is_terminal", lambda: True)
    with mod.Progress("cam", Messages(False)) as p:
        p(1, 4)
        p(1, 3, "scorecam: masked forward passes")
        p(3, 3, "scorecam: masked forward passes")
        p(1, 3, "scorecam: masked forward passes")  # the next batch starts again
        assert [t.description for t in p._bar.tasks] == ["cam", "scorecam: masked forward passes"]
        assert p._bar.tasks[1].completed == 1
        p._bar.console.file = io.StringIO()


# ----------------------------------------------------------------- off a terminal (issue 29)
SLOW = '''
import time
import torch
from torch import nn


class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(0.15)
        return self.fc(self.conv(x).mean((2, 3)))
'''


def test_off_a_terminal_a_progress_line_every_interval(cli, tmp_path: Any, monkeypatch: Any) -> None:
    """CliRunner's stderr is no terminal: progress lines appear at the interval, with
    done/total, the rate and an ETA (slow rates as s/image: test_rates_read_well_when_slow)."""
    import numpy as np
    from PIL import Image

    model = tmp_path / "slow.py"
    model.write_text(SLOW)
    images = []
    for i in range(4):
        p = tmp_path / f"i{i}.png"
        Image.fromarray(np.full((12, 12, 3), 40 * i, dtype=np.uint8)).save(p)
        images.append(str(p))
    monkeypatch.setenv("INSPECT_MODEL_PROGRESS_SECONDS", "0.1")
    res = cli(["activations", f"{model}:Slow", *images, "--weights", "none", "--resize", "12", "--crop", "12",
               "--batch-size", "1"])
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ")]
    assert lines, res.stderr
    assert any("activations: 1/4 images" in ln or "activations: 2/4 images" in ln for ln in lines), lines
    assert all(("images/s" in ln or "s/image" in ln) and "elapsed" in ln for ln in lines), lines
    assert any("ETA" in ln for ln in lines), lines
    final = [ln for ln in res.stderr.splitlines() if ln.startswith("4 image(s) in")]
    assert final and "0.0 images/s" not in res.stderr
    quiet = cli(["activations", f"{model}:Slow", *images[:2], "--weights", "none", "--resize", "12",
                 "--crop", "12", "--batch-size", "1", "-q"])
    assert quiet.exit_code == 0 and "progress:" not in quiet.stderr


def test_default_interval_prints_nothing_for_short_runs(cli, models_py: Any) -> None:
    res = cli(["activations", f"{models_py}:TinyCNN", "--weights", "none", "--input-size", "3x8x8"])
    assert res.exit_code == 0 and "progress:" not in res.stderr


def test_bad_interval_is_a_usage_error(cli, models_py: Any, monkeypatch: Any) -> None:
    for bad in ("abc", "0", "-3", "nan", "inf"):
        monkeypatch.setenv("INSPECT_MODEL_PROGRESS_SECONDS", bad)
        res = cli(["activations", f"{models_py}:TinyCNN", "--weights", "none", "--input-size", "3x8x8"])
        assert res.exit_code == 2, (bad, res.stderr)
        assert res.stderr.strip().splitlines() == [
            f"error: environment variable INSPECT_MODEL_PROGRESS_SECONDS={bad!r} is not a number more than 0 and at "
            "most 1e+09; fix it or unset it (default 30)"]  # the one typed reader's words (issue 41)


def test_rates_read_well_when_slow() -> None:
    from inspect_model.cli.progress import format_duration, format_rate

    assert format_rate(1, 2760.0) == "2760.0 s/image"  # 46 minutes for one image, not "0.0 images/s"
    assert format_rate(3, 10.0) == "0.30 images/s (3.3 s/image)"
    assert format_rate(50, 2.0) == "25.0 images/s"
    assert format_rate(7, 140.0, "step") == "20.0 s/step"
    assert format_duration(2760) == "46m00s" and format_duration(42) == "42s" and format_duration(7322) == "2h02m"


def test_progress_lines_count_what_the_plan_counts(cli, tmp_path, monkeypatch):
    """A --text run counts texts and patch counts prompt pairs, in the progress lines as in the
    final line (not "images")."""
    from fixtures.task_models import save_task_model

    folder = save_task_model("gpt2", tmp_path / "gpt2")
    monkeypatch.setenv("INSPECT_MODEL_PROGRESS_SECONDS", "1e-6")
    texts = ["the cat sat", "a dog ran", "the movie was"]
    res = cli(["activations", str(folder), *[a for t in texts for a in ("--text", t)], "--batch-size", "1"])
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ")]
    assert lines and all("texts" in ln and "images" not in ln for ln in lines), lines
    assert any(ln.startswith("3 text(s) in") for ln in res.stderr.splitlines()), res.stderr
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"clean": "the cat sat on the", "corrupt": "{c}"}}\n'
                             for c in ("the dog ran to the", "a cat sat on a")))
    res = cli(["patch", str(folder), "--pairs", str(pairs), "--metric", "prob: mat", "--sites", "resid",
               "--batch-size", "1"])
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ")]
    assert lines and all("pairs" in ln and "images" not in ln for ln in lines), lines
