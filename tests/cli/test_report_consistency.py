"""Small inconsistencies between reports (issue 39, item 12): the progress lines' rate and the
final timing line count the same time (after loading); video clips are counted as clips;
guided-backprop shows the target's probability as cam does; summary's input_shapes has a
batch dimension for detectors as for every other model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT
from fixtures.videos import moving_square, video_net_file, write_video

SLOW_LOAD = '''
import time
import torch
from torch import nn


class SlowLoad(nn.Module):
    """Takes 1.5 s to build and 0.15 s per image: a rate over loading too would be 2.5x slower."""

    def __init__(self):
        super().__init__()
        time.sleep(1.5)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        time.sleep(0.15)
        return self.fc(x.mean(dim=(2, 3)))
'''


def _seconds_per_image(text: str) -> float:
    """A rate as format_rate writes it, in seconds per image."""
    m = re.search(r"([\d.]+) s/image", text)
    if m:
        return float(m.group(1))
    return 1.0 / float(re.search(r"([\d.]+) images/s", text).group(1))


def test_progress_rate_and_final_line_agree(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slow.py").write_text(SLOW_LOAD)
    images = []
    for i in range(4):
        p = tmp_path / f"i{i}.png"
        Image.fromarray(np.full((12, 12, 3), 40 * i, dtype=np.uint8)).save(p)
        images.append(str(p))
    monkeypatch.setenv("INSPECT_MODEL_PROGRESS_SECONDS", "0.01")
    res = cli(["activations", f"{tmp_path / 'slow.py'}:SlowLoad", *images, "--resize", "12", "--crop", "12",
               "--batch-size", "1"])
    assert res.exit_code == 0, res.stderr
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ") and "4/4 images" in ln]
    final = [ln for ln in res.stderr.splitlines() if ln.startswith("4 image(s) in")]
    assert progress and final, res.stderr
    assert "after loading the model" in final[0]
    p, f = _seconds_per_image(progress[-1]), _seconds_per_image(final[0].split(": ", 1)[1])
    assert 0.6 < p / f < 1.6, (progress[-1], final[0])  # with loading counted, p / f was ~2.5


def test_clips_are_counted_as_clips(cli, tmp_path: Path) -> None:
    video = write_video(tmp_path / "v.mp4", moving_square(12))
    res = cli(["activations", f"{video_net_file(tmp_path)}:build", str(video), "--frames", "4", "--clips", "2",
               "--resize", "40", "--crop", "32"])
    assert res.exit_code == 0, res.stderr
    assert re.search(r"^2 clip\(s\) in [\d.]+ s after loading the model: .* (clips/s|s/clip)", res.stderr, re.M), \
        res.stderr
    assert "image(s) in" not in res.stderr


def test_guided_backprop_reports_the_probability_as_cam_does(cli) -> None:
    cat = str(ROOT / "sample_images" / "cat.jpg")
    args = ["resnet18", cat, "--weights", "none", "--resize", "64", "--crop", "64", "--json"]
    gb = json.loads(cli(["guided-backprop", *args]).stdout)
    cam = json.loads(cli(["cam", *args]).stdout)
    t = gb["images"][0]["maps"][0]["target"]
    assert t["probability"] == pytest.approx(cam["images"][0]["maps"][0]["target"]["probability"], abs=1e-4)
    text = cli(["guided-backprop", *args[:-1]]).stdout
    header = next(ln for ln in text.splitlines() if ln.startswith("Image"))
    assert "Prob" in header and "Score" in header


@pytest.mark.slow
def test_detector_summary_input_shapes_have_a_batch_dimension(cli) -> None:
    doc = json.loads(cli(["summary", "fasterrcnn_mobilenet_v3_large_320_fpn", "--json", "--batch-size", "2",
                          "-q"]).stdout)
    assert doc["input_shapes"] == [[2, 3, 520, 520]]
    assert doc["options"]["input_size"] == [[2, 3, 520, 520]]
