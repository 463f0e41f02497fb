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
