"""The CLI is a thin shell over the API (issue 12): for every command, the CLI's ``--json``
document equals the API result's ``to_dict()`` on the same inputs, volatile fields aside, and
``result.save(dir)`` writes the same files as ``--output-dir``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import inspect_model as im
from inspect_model.api import InputOptions, ModelOptions

# Wall-clock and memory measurements differ between any two runs.
VOLATILE = {"seconds", "elapsed_seconds", "time_seconds", "peak_memory_mb", "memory_mb", "value_seconds",
            "images_per_second"}


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _check_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """check's per-check values hold timings: drop the values of the timed checks only."""
    for c in doc.get("checks", []):
        if c.get("name") in ("time", "memory", "max-seconds", "max-memory"):
            c.pop("value", None)
            c.pop("detail", None)
            c.pop("message", None)
    return doc


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate([(20, 16), (16, 24)]):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    # command: (extra CLI options, the same as API keyword arguments)
    "activations": (["--layers", "type:Conv2d"], {"layers": ["type:Conv2d"]}),
    "grads": (["--target", "top:2"], {"target": "top:2"}),
    "guided-backprop": (["--target", "1"], {"target": "1"}),
    "cam": (["--method", "gradcam", "--method", "eigencam", "--layer", "features.3"],
            {"methods": ["gradcam", "eigencam"], "layers": ["features.3"]}),
    "attributions": (["--method", "saliency,integrated-gradients", "-m", "occlusion", "--steps", "4", "--window", "8"],
                     {"methods": ["saliency", "integrated-gradients", "occlusion"], "steps": 4, "window": "8"}),
}
API = {"activations": "activations", "grads": "grads", "guided-backprop": "guided_backprop", "cam": "cam",
       "attributions": "attributions"}
PRE = ["--resize", "16", "--crop", "16", "--batch-size", "2"]


@pytest.mark.parametrize("command", list(CASES))
def test_image_commands_cli_json_equals_api(command: str, images: list[str], models_py: Path, cli,
                                             tmp_path: Path) -> None:
    spec = f"{models_py}:TinyCNN"
    cli_extra, api_kw = CASES[command]
    r = cli([command, spec, *images, "--weights", "none", *PRE, *cli_extra, "--json"])
    assert r.exit_code == 0, r.stderr
    cli_doc = json.loads(r.stdout)
    result = getattr(im, API[command])(
        None, model_options=ModelOptions(spec, weights="none"),
        inputs=InputOptions(images, resize=16, crop=16, batch_size=2), **api_kw)
    api_doc = json.loads(json.dumps(result.to_dict(), default=str))
    assert _strip(cli_doc) == _strip(json.loads(_dumps(result.to_dict())))
    assert api_doc["command"] == command
    # save(dir) writes what --output-dir writes, with the same report.json
    out_cli, out_api = tmp_path / "cli", tmp_path / "api"
    r = cli([command, spec, *images, "--weights", "none", *PRE, *cli_extra, "-o", str(out_cli)])
    assert r.exit_code == 0, r.stderr
    result.save(out_api)
    files_cli = sorted(p.relative_to(out_cli).as_posix() for p in out_cli.rglob("*") if p.is_file())
    files_api = sorted(p.relative_to(out_api).as_posix() for p in out_api.rglob("*") if p.is_file())
    assert files_cli == files_api
    assert "report.json" in files_cli and "report.txt" in files_cli
    saved_cli = json.loads((out_cli / "report.json").read_text())
    saved_api = json.loads((out_api / "report.json").read_text())
    assert _strip(saved_cli) == _strip(saved_api)
    assert saved_cli["files"] == files_cli  # relative to the directory, every file listed


def _dumps(doc: dict[str, Any]) -> str:
    from inspect_model.output.jsonout import dumps

    return dumps(doc)


def test_summary_cli_json_equals_api(models_py: Path, cli) -> None:
    spec = f"{models_py}:TinyCNN"
    r = cli(["summary", spec, "--input-size", "3x8x8", "--json"])
    assert r.exit_code == 0, r.stderr
    result = im.summary(spec, input_size=["3x8x8"])
    assert _strip(json.loads(r.stdout)) == _strip(json.loads(_dumps(result.to_dict())))


def test_check_cli_json_equals_api(models_py: Path, cli) -> None:
    spec = f"{models_py}:TinyCNN"
    r = cli(["check", spec, "--input-size", "3x8x8", "--weights", "none", "--deterministic", "--json"])
    assert r.exit_code == 0, r.stderr
    result = im.check(None, model_options=ModelOptions(spec, weights="none"),
                      inputs=InputOptions(input_size=["3x8x8"]), deterministic=True)
    assert result.passed
    cli_doc = _check_doc(_strip(json.loads(r.stdout)))
    api_doc = _check_doc(_strip(json.loads(_dumps(result.to_dict()))))
    assert cli_doc == api_doc


def test_attention_cli_json_equals_api(images: list[str], cli, tmp_path: Path) -> None:
    import shutil

    models = tmp_path / "attn_models.py"
    shutil.copy(Path(__file__).parents[1] / "fixtures" / "attention_models.py", models)
    spec = f"{models}:tiny_vit"
    pre = ["--input-size", "3x32x32", "--batch-size", "2", "-m", "all", "--heads", "all", "--mosaic"]
    r = cli(["attention", spec, *images, *pre, "--json"])
    assert r.exit_code == 0, r.stderr
    result = im.attention(None, model_options=ModelOptions(spec), methods=["all"], heads="all", mosaic=True,
                          inputs=InputOptions(images, input_size=["3x32x32"], batch_size=2))
    assert _strip(json.loads(r.stdout)) == _strip(json.loads(_dumps(result.to_dict())))
    out_cli, out_api = tmp_path / "cli", tmp_path / "api"
    r = cli(["attention", spec, *images, *pre, "-o", str(out_cli)])
    assert r.exit_code == 0, r.stderr
    result.save(out_api)
    files_cli = sorted(p.relative_to(out_cli).as_posix() for p in out_cli.rglob("*") if p.is_file())
    files_api = sorted(p.relative_to(out_api).as_posix() for p in out_api.rglob("*") if p.is_file())
    assert files_cli == files_api and len(files_cli) == 3 + 2 * 6  # per image: 3 methods, compare, raw, mosaic
    for name in files_cli:
        if name.endswith(".png"):
            assert (out_cli / name).read_bytes() == (out_api / name).read_bytes(), name


def test_every_command_has_an_equality_case() -> None:
    from inspect_model.cli.app import COMMANDS

    covered = {*CASES, "summary", "check", "models", "attention",  # models lists the registry: no model is run
               "lens", "patch", "compare"}  # tests/e2e/test_api_cli_equality_lm.py
    assert set(COMMANDS) <= covered
