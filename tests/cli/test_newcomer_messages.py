"""Messages that sent a newcomer the wrong way (issue 39, items 3-8): each names what was typed
and what to do; ImageNet's class names with `--weights none` for torchvision classifiers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import ROOT
from inspect_model import errors

CAT = str(ROOT / "sample_images" / "cat.jpg")


def _error(res, code: int) -> str:
    assert res.exit_code == code, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ")
    return line


# 3 -------------------------------------------------------------------------------------------
def test_missing_hub_config_points_to_a_local_folder_not_weights_none(cli, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _error(cli(["summary", "hf:acme/nothing-here", "--weights", "none"]), errors.EXIT_MODEL_LOAD)
    assert "the config of hf:acme/nothing-here" in line
    assert "run with --weights none" not in line  # already given: the config is what is missing
    assert "--weights none needs too" in line and "save_pretrained" in line


# 4 -------------------------------------------------------------------------------------------
@pytest.fixture
def batch1_pt2(tmp_path: Path) -> Path:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    path = tmp_path / "b1.pt2"
    torch.export.save(torch.export.export(net, (torch.randn(1, 3, 32, 32),)), str(path))
    return path


def test_one_image_runs_on_a_batch_1_export_despite_the_default_batch_size(cli, batch1_pt2: Path) -> None:
    res = cli(["cam", str(batch1_pt2), CAT, "--resize", "32", "--crop", "32", "--quiet"])
    assert res.exit_code == 0, res.stderr
    res = cli(["activations", str(batch1_pt2), CAT, str(ROOT / "sample_images" / "astronaut.jpg"), "--resize", "32", "--crop", "32", "--batch-size", "8"])
    line = _error(res, errors.EXIT_INPUT)  # two images make one batch of 2: that is what cannot run
    assert "static batch size of 1; pass --batch-size 1 (got 2 input(s), one batch of 2)" in line


# 5 -------------------------------------------------------------------------------------------
def test_true_label_name_without_class_names_names_the_option_typed(cli, models_py: Path) -> None:
    res = cli(["grads", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--loss", "cross-entropy",
               "--true-label", "tabby"])
    line = _error(res, errors.EXIT_INPUT)
    assert line.startswith("error: --true-label 'tabby' is not an index")
    assert "--class-names FILE" in line and "--labels" not in line and "--target" not in line


def test_target_name_without_class_names_says_class_names(cli, models_py: Path) -> None:
    line = _error(cli(["cam", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--target", "tabby"]),
                  errors.EXIT_INPUT)
    assert line.startswith("error: --target 'tabby' is not an index") and "--class-names FILE" in line


def test_imagenet_categories_ship_offline_with_weights_none(cli) -> None:
    import torchvision

    from inspect_model.loading.models import load_torchvision

    cats = torchvision.models.get_model_weights("resnet18").DEFAULT.meta["categories"]
    loaded = load_torchvision("resnet18", weights=None, device="meta")
    assert loaded.categories == cats and loaded.categories[281] == "tabby"
    assert load_torchvision("resnet18", weights=None, device="meta", build_args={"num_classes": 10}).categories is None
    res = cli(["cam", "resnet18", CAT, "--weights", "none", "--target", "tabby", "--resize", "64", "--crop", "64"])
    assert res.exit_code == 0, res.stderr
    assert "281" in res.stdout and "tabby" in res.stdout
    res = cli(["grads", "resnet18", CAT, "--weights", "none", "--loss", "cross-entropy", "--true-label", "tabby",
               "--resize", "64", "--crop", "64", "--json"])
    assert res.exit_code == 0, res.stderr


# 6 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["summary", "vit_b_16", "--input-size", "3x256x256"],
    ["cam", "vit_b_16", CAT, "--weights", "none", "--crop", "256", "--quiet"],
])
def test_vit_at_the_wrong_size_names_the_size_and_the_fixes(cli, argv: list[str]) -> None:
    res = cli(argv)
    line = res.stderr.strip().splitlines()[-1]
    assert res.exit_code in (errors.EXIT_INPUT, errors.EXIT_RUNTIME), res.stderr
    assert "the model takes 224x224 images, not 256x256" in line
    assert "--input-size 3x224x224" in line and "--crop 224" in line
    assert "--weights none --model-arg image_size=256" in line
    assert "input channels" not in line  # the old hint the input already met


def test_size_hint_reads_the_model() -> None:
    from inspect_model.engine.hints import size_hint

    class Fixed(nn.Module):
        image_size = 64

    assert "takes 64x64 images, not 96x96" in size_hint(Fixed(), "Wrong image height! Expected 64 but got 96!")
    assert size_hint(nn.Linear(2, 2), "Wrong image height! Expected 64 but got 96!") is None
    assert size_hint(Fixed(), "mat1 and mat2 shapes cannot be multiplied") is None


# 7 -------------------------------------------------------------------------------------------
def test_device_completion_offers_meta_only_where_it_runs() -> None:
    from inspect_model.cli import completion

    assert "meta" not in completion.complete_device("")
    assert completion.complete_summary_device("m") == ["meta", "mps"]


def test_only_summary_completes_meta(cli) -> None:
    import os
    import subprocess
    import sys

    def complete(words: str) -> list[str]:
        env = {**os.environ, "_INSPECT_MODEL_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - 1)}
        out = subprocess.run([sys.executable, "-m", "inspect_model"], capture_output=True, text=True, env=env,
                             timeout=120)
        return out.stdout.split()

    assert "meta" in complete("inspect-model summary resnet18 --device me")
    assert "meta" not in complete("inspect-model cam resnet18 --device me")


# 8 -------------------------------------------------------------------------------------------
def test_torchscript_refusal_is_about_the_file_and_check_runs(cli, tmp_path: Path) -> None:
    path = tmp_path / "net.ts"
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with pytest.warns(Warning) if hasattr(torch.jit, "script") else pytest.raises(AssertionError):
        scripted = torch.jit.script(net)
    torch.jit.save(scripted, str(path))
    line = _error(cli(["cam", str(path), "--input-size", "4"]), errors.EXIT_MODEL_LOAD)
    assert "inspect-model models" not in line and "`inspect-model check` runs on it" in line
    res = cli(["check", str(path), "--input-size", "4", "--expect-output-shape", "1x3", "--deterministic",
               "--max-seconds", "60"])
    assert res.exit_code == 0, res.stderr
    assert "PASS  output shape: 1x3" in res.stdout and "PASS  finite gradients" in res.stdout
    assert "PASS  time" in res.stdout and "dead layers" not in res.stdout
    assert "dead-layers check is skipped" in res.stderr
