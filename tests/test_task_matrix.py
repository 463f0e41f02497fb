"""Every command on every task family runs or refuses in one line (issue 42): GPT-2, Llama
(GQA, RoPE), a BERT classifier, a head-less BertModel, T5, CLIPModel, CLIP's vision tower,
a ViT (all tiny, built from configs offline), and torchvision's resnet18, a detector, a
segmenter and a video model (untrained: ``--weights none``). No run may end in exit 6 (the
model failed) or an "unexpected" error from our side."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.fixtures.task_models import save_task_model

IMAGE = "/work/shared/sample_images/cat.jpg"
TEXT = ["--text", "the cat sat on the"]
COMMANDS = ("summary", "check", "activations", "grads", "guided-backprop", "cam", "attributions", "attention")
HF = ("gpt2", "llama", "bert", "bertmodel", "t5", "clip", "clipvision", "vit")
TORCHVISION = {"resnet18": [], "fasterrcnn_mobilenet_v3_large_320_fpn": [], "lraspp_mobilenet_v3_large": [],
               "r3d_18": ["--frames", "4"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return {k: str(save_task_model(k, root / k)) for k in HF}


def _args(command: str, model: str, folder: str | None) -> list[str]:
    if folder is None:  # torchvision
        extra = TORCHVISION[model]
        if command == "summary":
            return [command, model]
        return [command, model, IMAGE, "--weights", "none", *extra]
    if model in ("gpt2", "llama", "bert", "bertmodel", "t5"):
        return [command, folder, *([] if command == "summary" else TEXT)]
    if model == "clip":
        return [command, folder] if command == "summary" else [command, folder, IMAGE, "--text", "a cat",
                                                                "--text", "a dog"]
    return [command, folder] if command == "summary" else [command, folder, IMAGE]


def _check(r, what: str) -> None:
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code != 6, f"{what}: exit 6: {errors}"
    assert "unexpected" not in r.stderr.lower(), f"{what}: {errors}"
    assert "Traceback" not in r.stderr, what
    assert len(errors) <= 1, what
    if r.exit_code != 0:
        assert errors, f"{what}: exit {r.exit_code} without an error line"


@pytest.mark.slow
@pytest.mark.parametrize("model", HF)
def test_every_command_on_hf_models(folders, model, tmp_path):
    for command in COMMANDS:
        r = run_cli(_args(command, model, folders[model]) + ["-o", str(tmp_path / command)]
                    if command != "summary" else _args(command, model, folders[model]))
        _check(r, f"{command} {model}")


@pytest.mark.slow
@pytest.mark.parametrize("model", list(TORCHVISION))
def test_every_command_on_torchvision_models(model, tmp_path):
    for command in COMMANDS:
        r = run_cli(_args(command, model, None))
        _check(r, f"{command} {model}")
