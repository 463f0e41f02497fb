"""The CLI is a thin shell over the API (issue 12) for the commands of issues 36 and 38:
``lens``, ``patch`` and ``compare`` write with ``--json`` what the API result's ``to_dict()``
holds, volatile fields aside, and ``result.save(dir)`` writes the files ``--output-dir`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import inspect_model as im
from inspect_model.api import InputOptions, ModelOptions
from test_api_cli_equality import _dumps, _strip

pytestmark = pytest.mark.slow  # each case loads a model in two processes' worth of runs


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixtures.task_models import save_task_model

    return save_task_model("gpt2", tmp_path_factory.mktemp("equality_lm") / "gpt2")


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _same(cli, args: list[str], result: Any, tmp_path: Path) -> None:
    r = cli([*args, "--json"])
    assert r.exit_code == 0, r.stderr
    assert _strip(json.loads(r.stdout)) == _strip(json.loads(_dumps(result.to_dict())))
    out_cli, out_api = tmp_path / "cli", tmp_path / "api"
    r = cli([*args, "-o", str(out_cli)])
    assert r.exit_code == 0, r.stderr
    result.save(out_api)
    assert _files(out_cli) == _files(out_api)
    assert "report.json" in _files(out_cli)
    saved = [json.loads((d / "report.json").read_text()) for d in (out_cli, out_api)]
    assert _strip(saved[0]) == _strip(saved[1])


def test_lens_cli_json_equals_api(cli, gpt2: Path, tmp_path: Path) -> None:
    texts = ["the cat sat on the", "a dog"]
    args = ["lens", str(gpt2), *[a for t in texts for a in ("--text", t)], "--top-k", "3"]
    result = im.lens(None, model_options=ModelOptions(str(gpt2)), inputs=InputOptions(text=texts), top_k=3)
    _same(cli, args, result, tmp_path)


def test_patch_cli_json_equals_api(cli, gpt2: Path, tmp_path: Path) -> None:
    clean, corrupt = "the cat sat on the", "the dog ran to the"
    args = ["patch", str(gpt2), "--clean", clean, "--corrupt", corrupt, "--metric", "logit-diff: mat,cat",
            "--sites", "resid,head"]
    result = im.patch(None, model_options=ModelOptions(str(gpt2)), clean=clean, corrupt=corrupt,
                      metric="logit-diff: mat,cat", sites="resid,head")
    _same(cli, args, result, tmp_path)


def test_compare_cli_json_equals_api(cli, models_py: Path, tmp_path: Path) -> None:
    spec = f"{models_py}:TinyCNN"
    args = ["compare", spec, "--weights", "none", "--input-size", "3x8x8", "--against-dtype", "bfloat16"]
    result = im.compare(None, None, model_options=ModelOptions(spec, weights="none"),
                        inputs=InputOptions(None, input_size=["3x8x8"]), against_dtype="bfloat16")
    _same(cli, args, result, tmp_path)


def test_attributions_over_a_generation_cli_json_equals_api(cli, gpt2: Path, tmp_path: Path) -> None:
    args = ["attributions", str(gpt2), "--text", "the cat sat", "--generate", "2", "-m", "saliency",
            "-m", "integrated-gradients", "--steps", "4"]
    result = im.attributions(None, model_options=ModelOptions(str(gpt2)), inputs=InputOptions(text=["the cat sat"]),
                             generate=2, methods=["saliency", "integrated-gradients"], steps=4)
    _same(cli, args, result, tmp_path)
