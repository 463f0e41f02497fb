"""The attention command: CLI and API agree, its report validates, its files are there,
bad input is one line with its exit code, and --resume gives the plain run's report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from inspect_model.schemas import load_schema

ROOT = Path(__file__).resolve().parents[2]
IMAGES = [str(ROOT / "sample_images" / n) for n in ("cat.jpg", "astronaut.jpg")]


@pytest.fixture
def spec(tmp_path: Path) -> str:
    p = tmp_path / "attn_models.py"
    shutil.copy(ROOT / "tests" / "fixtures" / "attention_models.py", p)
    return f"{p}:tiny_vit"


def test_cli_report_files_and_schema(cli, spec: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli(["attention", spec, *IMAGES, "--input-size", "3x32x32", "-m", "all", "--heads", "all", "--mosaic",
             "-l", "0", "-l", "-1", "-o", str(out), "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("attention")).validate(doc)
    assert doc["methods"] == ["raw", "rollout", "grad-rollout", "legrad"]
    assert doc["grid"] == [4, 4] and doc["prefix_tokens"] == 1 and doc["heads"] == 2
    first = doc["images"][0]
    assert [m["method"] for m in first["maps"]] == ["rollout", "grad-rollout", "legrad", "raw", "raw"]
    tag = f"c{first['target']['class']}"
    names = {"rollout": f"rollout.{tag}.png", "legrad": f"legrad.{tag}.png", "mosaic": "mosaic.png",
             "raw": "raw.encoder.layers.encoder_layer_1.self_attention.png"}
    for name in names.values():
        assert (out / "images" / "0000-cat" / name).is_file()
    assert sorted(doc["files"]) == sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    html = (out / "report.html").read_text()
    assert "rollout @ all" in html and "mosaic.png" in html


def test_api_equals_cli(cli, spec: str) -> None:
    import inspect_model as im

    r = cli(["attention", spec, *IMAGES, "--input-size", "3x32x32", "-m", "rollout,grad-rollout", "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    res = im.attention(spec, IMAGES, methods=["rollout", "grad-rollout"],
                       inputs=im.InputOptions(IMAGES, input_size=["3x32x32"]))
    assert json.loads(r.stdout)["images"] == json.loads(json.dumps(res.to_dict()["images"]))
    assert res.maps["rollout"].shape == (2, 4, 4)


@pytest.mark.parametrize(("args", "code", "message"), [
    (["-m", "nope"], 2, "error: --method 'nope' is not an attention method"),
    (["--heads", "0,7", "-m", "raw"], 2, "error: --heads 7 is out of range"),
    (["--layers", "9", "-m", "raw"], 5, "error: --layers 9 is out of range: the model has 2 attention layers"),
    (["--discard-ratio", "1.5"], 2, "error: --discard-ratio 1.5 must be in [0, 1)"),
])
def test_bad_options_are_one_line(cli, spec: str, args: list[str], code: int, message: str) -> None:
    r = cli(["attention", spec, IMAGES[0], "--input-size", "3x32x32", *args])
    assert r.exit_code == code, r.stderr
    assert r.stderr.startswith(message) and r.stderr.count("\n") == 1, r.stderr


def test_no_attention_found(cli, spec: str) -> None:
    r = cli(["attention", spec.replace("tiny_vit", "tiny_cnn"), IMAGES[0], "--input-size", "3x32x32"])
    assert r.exit_code == 5
    assert r.stderr.startswith("error: no attention found in Sequential") and r.stderr.count("\n") == 1


def test_resume_equals_plain_run(cli, spec: str, tmp_path: Path) -> None:
    common = ["attention", spec, *IMAGES, "--input-size", "3x32x32", "-m", "all", "--batch-size", "1", "--json", "-q"]
    plain = cli([*common, "-o", str(tmp_path / "a")])
    resumed = cli([*common, "-o", str(tmp_path / "b"), "--resume"])
    assert plain.exit_code == 0 and resumed.exit_code == 0, resumed.stderr
    a, b = json.loads(plain.stdout), json.loads(resumed.stdout)
    assert a["images"] == b["images"] and sorted(a["files"]) == sorted(b["files"])


def test_evaluate_ranks_the_maps(cli, spec: str, tmp_path: Path) -> None:
    """One run ranks rollout, grad-rollout, LeGrad and Grad-CAM (issue 26, item 5), from one
    forward pass and two backward passes (grad-rollout's, shared by Grad-CAM, and LeGrad's)."""
    r = cli(["attention", spec, IMAGES[0], "--input-size", "3x32x32", "-m", "all,gradcam", "--evaluate", "--metric",
             "deletion,insertion", "--eval-steps", "4", "--json", "-q", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("attention")).validate(doc)
    assert doc["passes_per_batch"] == {"forward": 1, "backward": 2}
    rows = doc["evaluation"]["average"]
    assert sorted(row["method"] for row in rows) == ["grad-rollout", "gradcam", "legrad", "rollout"]
    assert all(set(row["scores"]) >= {"deletion", "insertion"} for row in rows)
    scored = [m for m in doc["images"][0]["maps"] if m["method"] != "raw"]
    assert all(len(m["evaluation"]["curves"]["deletion"]) == 5 for m in scored)
    cam = next(m for m in scored if m["method"] == "gradcam")
    assert cam["layer"] == doc["cam_layer"] == "encoder.layers.encoder_layer_1.ln_1"  # as cam's --layer auto
    assert (tmp_path / "out" / cam["files"]["overlay"]).is_file() and "/gradcam." in cam["files"]["overlay"]
    assert (tmp_path / "out" / doc["images"][0]["files"]["compare"]).is_file()


def test_cam_methods_refused_with_the_way_out(cli, spec: str) -> None:
    r = cli(["attention", spec, IMAGES[0], "--input-size", "3x32x32", "-m", "rollout,scorecam"])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "error: --method 'scorecam' takes a classifier check or passes of its own: run `inspect-model cam MODEL "
        "IMAGES --method scorecam` (attention adds gradcam, gradcam++, xgradcam, layercam, hirescam, eigencam)"]


def _close(a: object, b: object) -> bool:
    """Equal, floats to 1e-5 relative (float sums in another order)."""
    import math

    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_torchrun_two_ranks_equal_one_process(cli, spec: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    common = [spec, *IMAGES, str(ROOT / "sample_images" / "coffee.jpg"), "--input-size", "3x32x32", "-m", "all",
              "--batch-size", "1", "--json", "-q"]
    one = cli(["attention", *common, "-o", str(tmp_path / "one")])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                          "-m", "inspect_model", "attention", *common, "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert one.exit_code == 0 and two.returncode == 0, two.stderr[-2000:]
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    # the ranks run with one thread, this process with torch's default: sums in another order
    assert _close(a["images"], b["images"]) and sorted(a["files"]) == sorted(b["files"])
