"""``inspect-model attributions`` on the command line: --json against the schema and the
API, files, token ids, --resume, and one-line errors with their exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOKENS = '''
import torch
from torch import nn


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


class NoEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(ids.float())
'''

COMMON = ["--input-size", "3x16x16", "--batch-size", "2", "-q"]


def _doc(r) -> dict:
    import jsonschema

    from inspect_model.schemas import load_schema

    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("attributions")).validate(doc)
    return doc


@pytest.mark.slow  # over 3 s (issue 35: the quick tier under 2 minutes); full run only
def test_json_equals_the_api_and_files_are_written(cli, models_py: Path, tmp_path: Path) -> None:
    import torch

    import inspect_model as im

    spec = f"{models_py}:TinyCNN"
    args = ["attributions", spec, *COMMON, "--method", "saliency,integrated-gradients", "-m", "occlusion",
            "--steps", "4", "--window", "4", "--window-stride", "4", "--target", "top:2"]
    doc = _doc(cli([*args, "--json"]))
    assert doc["methods"] == ["saliency", "integrated-gradients", "occlusion"]
    assert [len(e["maps"]) for e in doc["images"]] == [6, 6]
    api = im.attributions(spec, None, "top:2", methods=["saliency", "integrated-gradients", "occlusion"], steps=4,
                          window="4", stride="4", inputs=im.InputOptions(input_size=["3x16x16"], batch_size=2))
    assert api.to_dict()["images"] == doc["images"]
    out = tmp_path / "o"
    r = cli([*args, "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    files = json.loads((out / "report.json").read_text())["files"]
    assert "contact_sheet_001.png" in files and "report.html" in files
    assert sum(f.endswith(".heatmap.png") for f in files) == 12
    assert isinstance(api.maps["occlusion"], torch.Tensor)


def test_token_ids_are_attributed_at_the_embedding(cli, tmp_path: Path) -> None:
    src = tmp_path / "tokens.py"
    src.write_text(TOKENS)
    doc = _doc(cli(["attributions", f"{src}:Tokens", "--input-size", "8:int64:0-20", "-m", "ig", "--steps", "4",
                    "--json", "-q"]))
    assert doc["space"] == "embedding" and doc["embedding_layer"] == "embed"
    image = doc["images"][0]
    assert len(image["token_ids"]) == 8 and len(image["maps"][0]["tokens"]) == 8
    assert sum(image["maps"][0]["tokens"]) == pytest.approx(image["maps"][0]["sum"])
    r = cli(["attributions", f"{src}:NoEmbedding", "--input-size", "8:int64:0-20", "-q"])
    assert r.exit_code == 4
    assert r.stderr.strip().splitlines() == [
        "error: the input is int64, which cannot be differentiated, and the model has no nn.Embedding layer "
        "reading it to attribute to; give a floating-point input"]


@pytest.mark.parametrize(("extra", "code", "message"), [
    (["-m", "ig", "--steps", "0"], 2, "error: --steps 0: integrated gradients needs at least 1 step"),
    (["-m", "occlusion", "--window", "20"], 2,
     "error: --window 20 (3x20x20 on this input) is larger than the input (3, 16, 16); give a window no larger "
     "than 16x16"),
    (["-m", "salency"], 2, "error: --method 'salency' is not an attribution method; methods: saliency, gradient, "
     "input-x-gradient, integrated-gradients, smoothgrad, vargrad, occlusion, guided, all; did you mean "
     "'saliency'?"),
    (["-m", "ig", "--rule", "simpson"], 2, "error: --rule 'simpson' is not one of riemann-left, riemann-right, "
     "riemann-middle, riemann-trapezoid, gauss-legendre"),
])
def test_bad_options_are_one_line_errors(cli, models_py: Path, extra: list[str], code: int, message: str) -> None:
    r = cli(["attributions", f"{models_py}:TinyCNN", *COMMON, *extra])
    assert r.exit_code == code and r.stderr.strip().splitlines() == [message]


def test_baseline_file_of_the_wrong_shape(cli, models_py: Path, tmp_path: Path) -> None:
    import torch

    bad = tmp_path / "b.pt"
    torch.save(torch.zeros(3, 8, 8), bad)
    r = cli(["attributions", f"{models_py}:TinyCNN", *COMMON, "-m", "ig", "--baseline", str(bad)])
    assert r.exit_code == 4
    assert r.stderr.strip().splitlines() == [
        f"error: baseline file '{bad}' has shape (3, 8, 8); the input is (3, 16, 16) per sample: give a tensor of "
        "shape (3, 16, 16) (or (1, 3, 16, 16))"]


def test_resume_gives_the_report_of_one_run(cli, models_py: Path, tmp_path: Path) -> None:
    args = ["attributions", f"{models_py}:TinyCNN", "--input-size", "3x16x16", "--batch-size", "1", "-q",
            "-m", "smoothgrad,guided", "--samples", "2", "--json"]
    one = _doc(cli([*args, "-o", str(tmp_path / "a")]))
    resumed = _doc(cli([*args, "-o", str(tmp_path / "b"), "--resume"]))
    assert resumed["images"] == one["images"]
    assert sorted(resumed["files"]) == sorted(one["files"])


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_torchrun_two_ranks_equal_one_process(cli, models_py: Path, tmp_path: Path) -> None:
    """2 ranks (gloo) share the images; rank 0's report equals one process's."""
    import os
    import subprocess
    import sys

    import numpy as np
    from PIL import Image

    from conftest import ROOT

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(imgs / f"im{i}.png")
    args = ["attributions", f"{models_py}:TinyCNN", str(imgs), "--batch-size", "2", "--resize", "16", "--crop", "16",
            "-m", "ig,smoothgrad,occlusion", "--steps", "4", "--samples", "2", "--window", "8", "-q", "--json"]
    one = _doc(cli([*args, "-o", str(tmp_path / "one")]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        "-m", "inspect_model", *args, "-o", str(tmp_path / "two")],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    assert two["images"] == one["images"]

    def files(doc: dict) -> list[str]:  # each rank draws its own contact-sheet pages, as in cam
        return sorted(f for f in doc["files"] if not f.startswith("contact_sheet_"))

    assert files(two) == files(one) and two["contact_sheets"]
