"""Every command on every task family runs or refuses in one line (issue 42): GPT-2, Llama
(GQA, RoPE), a BERT classifier, a head-less BertModel, T5, CLIPModel, CLIP's vision tower,
a ViT (all tiny, built from configs offline), torchvision's resnet18 (untrained, on a 64 px
crop), a detector and a segmenter (torchvision's classes over a tiny body,
tests/fixtures/dense.py, untrained) and a 3-D CNN video model on a generated video. No run
may end in exit 6 (the model failed) or an "unexpected" error from our side."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.fixtures.task_models import save_task_model

IMAGE = "/work/shared/sample_images/cat.jpg"
TEXT = ["--text", "the cat sat on the"]
COMMANDS = ("summary", "check", "activations", "grads", "guided-backprop", "cam", "attributions", "attention")
HF = ("gpt2", "llama", "bert", "bertmodel", "t5", "clip", "clipvision", "vit")
OTHERS = ("resnet18", "detector", "segmenter", "video")
DENSE = """
import sys
sys.path.insert(0, {tests!r})
from fixtures.dense import tiny_detector, tiny_segmenter


def detector():
    return tiny_detector.__wrapped__(steps=0)  # not the per-process cache: summary builds it on meta


def segmenter():
    return tiny_segmenter.__wrapped__(steps=0)
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return {k: str(save_task_model(k, root / k)) for k in HF}


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """model -> (spec, the input arguments) of the image, dense and video models."""
    from pathlib import Path

    from tests.fixtures.videos import moving_square, video_net_file, write_video

    root = tmp_path_factory.mktemp("matrix_others")
    dense = root / "dense.py"
    dense.write_text(DENSE.format(tests=str(Path(__file__).parents[1])))
    video = root / "clip.mp4"
    write_video(video, moving_square(8, size=(32, 32), side=8))
    return {"resnet18": ("resnet18", [IMAGE, "--weights", "none", "--resize", "64", "--crop", "64"]),
            "detector": (f"{dense}:detector", [IMAGE]), "segmenter": (f"{dense}:segmenter", [IMAGE]),
            "video": (f"{video_net_file(root)}:build", [str(video), "--frames", "4"])}


def _args(command: str, model: str, folder: str | None, others: dict | None = None) -> list[str]:
    if folder is None:
        spec, inputs = others[model]
        if command == "summary":
            return [command, spec] + (["--input-size", "3x4x32x32"] if model == "video" else [])
        return [command, spec, *inputs]
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
@pytest.mark.parametrize("model", ("gpt2", "llama", "bert", "bertmodel", "t5"))
def test_every_command_on_token_ids_without_text(folders, model, tmp_path):
    """The issue's second input form: token ids of ``--input-size`` (no tokenizer needed)."""
    for command in COMMANDS:
        r = run_cli([command, folders[model], "--input-size", "input_ids=8:int64:4-30"]
                    + (["-o", str(tmp_path / command)] if command != "summary" else []))
        _check(r, f"{command} {model} --input-size")


@pytest.mark.slow
@pytest.mark.parametrize("model", OTHERS)
def test_every_command_on_image_dense_and_video_models(others, model, tmp_path):
    for command in COMMANDS:
        r = run_cli(_args(command, model, None, others) + (["-o", str(tmp_path / command)]
                                                             if command != "summary" else []))
        _check(r, f"{command} {model}")
