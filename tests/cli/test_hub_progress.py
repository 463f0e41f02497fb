"""transformers' and huggingface_hub's progress bars reach stderr only on a terminal (README:
progress only on a terminal; issue 39): loading a save_pretrained folder with its weights in a
pipeline prints no "Loading weights" bar, and the libraries' settings are put back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")


@pytest.fixture
def vit_folder(tmp_path: Path) -> Path:
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, num_labels=3)
    folder = tmp_path / "vit"
    transformers.ViTForImageClassification(cfg).save_pretrained(folder)
    return folder


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_no_loading_bar_when_stderr_is_not_a_terminal(vit_folder: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "inspect_model", "summary", str(vit_folder), "--weights", "DEFAULT",
                          "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Loading weights" not in res.stderr and "it/s]" not in res.stderr, res.stderr
    assert "Total params" in res.stdout


def test_bars_are_off_inside_and_put_back_after(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.utils import logging as tf_logging

    from inspect_model.loading.hub_models import quiet_hub_logs

    class Tty:
        def isatty(self) -> bool:
            return True

        def write(self, s: str) -> int:
            return len(s)

    tf_logging.enable_progress_bar()
    with quiet_hub_logs():  # pytest's captured stderr is no terminal
        assert not tf_logging.is_progress_bar_enabled()
    assert tf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys, "stderr", Tty())
    with quiet_hub_logs():  # a terminal: the bar is progress the user sees
        assert tf_logging.is_progress_bar_enabled()
