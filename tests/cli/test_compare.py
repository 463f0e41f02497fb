"""``compare`` (issue 38): the issue's checks, each against an independent computation.

Identical models give exact zeros; a perturbed checkpoint is named first divergent with
every layer before it exactly 0; a planted activation above 65504 is named as float16's
overflow; dynamic quantization's per-layer errors equal the ones computed here by hand;
a text model and a detector; --fail-above, --json against the schema, the files, errors as
one line, models unchanged after (also on failure).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn

import inspect_model as im
from fixtures.models import TinyCNN, assert_unchanged, model_state
from inspect_model.schemas import load_schema


def _doc(r) -> dict:
    assert r.exit_code in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, load_schema("compare"))
    return doc


def test_identical_models_give_exact_zeros_and_exit_0(cli, models_py: Path) -> None:
    r = cli(["compare", f"{models_py}:TinyCNN", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--json",
             "--fail-above", "0"])
    assert r.exit_code == 0, r.stderr
    doc = _doc(r)
    assert doc["matched"] == 7 and doc["first_divergent"] is None and doc["first_failing"] is None
    for row in doc["layers"]:
        assert (row["relative_error"], row["max_abs_error"], row["cosine"], row["beyond_tolerance"]) == (0, 0, 1, 0)
        assert row["status"] == "equal"
    assert doc["outputs"][0]["top1_agreement"] == 1.0 and doc["outputs"][0]["max_abs_change"] == 0
    mem = doc["memory"]  # a small model: B ran its whole forward ahead, all 7 outputs held within the budget
    assert mem["mode"] == "ahead" and mem["peak_outputs"] == 7 and 0 < mem["peak_bytes"] <= mem["budget_bytes"]


@pytest.fixture
def checkpoints(tmp_path: Path) -> tuple[Path, Path, TinyCNN, TinyCNN]:
    torch.manual_seed(3)
    a = TinyCNN().eval()
    b = TinyCNN().eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.features[3].weight[0, 0, 0, 0] += 0.5  # one layer's weight perturbed
    pa, pb = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(a.state_dict(), pa)
    torch.save(b.state_dict(), pb)
    return pa, pb, a, b


def test_perturbed_checkpoint_is_named_first_and_every_layer_before_is_exactly_zero(cli, models_py, checkpoints):
    pa, pb, a, b = checkpoints
    r = cli(["compare", f"{models_py}:TinyCNN", "--checkpoint", str(pa), "--against-checkpoint", str(pb),
             "--input-size", "3x8x8", "--json", "--fail-above", "1e-3"])
    assert r.exit_code == 1
    doc = _doc(r)
    assert doc["first_divergent"] == "features.3" and doc["first_failing"] == "features.3"
    names = [row["name"] for row in doc["layers"]]
    at = names.index("features.3")
    assert names[:at] == ["features.0", "features.1", "features.2"]
    assert all(row["relative_error"] == 0 and row["max_abs_error"] == 0 for row in doc["layers"][:at])
    assert doc["layers"][at]["max_abs_error"] > 0
    # the same pair through the API on a known input: the error at features.3 computed here
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    res = im.compare(a, x, against_model=b)
    with torch.no_grad():
        feats = a.features[:3](x.clone())
        ya, yb = a.features[3](feats).double(), b.features[3](feats).double()
    row = next(r for r in res.layers if r.name == "features.3")
    assert row.relative_error == pytest.approx(float((ya - yb).norm() / ya.norm()), rel=1e-5)
    assert row.max_abs_error == pytest.approx(float((ya - yb).abs().max()), rel=1e-5)
    assert "error: compare: layer 'features.3' is past --fail-above 0.001" in r.stderr


def test_weights_only_gives_the_relative_change_of_the_perturbed_layer(cli, models_py, checkpoints):
    pa, pb, a, b = checkpoints
    r = cli(["compare", f"{models_py}:TinyCNN", "--checkpoint", str(pa), "--against-checkpoint", str(pb),
             "--weights-only", "--json"])
    doc = _doc(r)
    rows = {w["name"]: w for w in doc["weights"]}
    assert doc["mode"] == "weights" and doc["first_divergent"] == "features.3"
    wa, ba = a.features[3].weight.detach().double(), a.features[3].bias.detach().double()
    step = float((b.features[3].weight.detach().double() - wa).abs().sum())  # 0.5 as float32 rounds it
    assert step == pytest.approx(0.5, rel=1e-6)
    expect = step / float(torch.sqrt((wa ** 2).sum() + (ba ** 2).sum()))
    assert rows["features.3"]["relative_change"] == pytest.approx(expect, rel=1e-12)
    assert rows["features.3"]["norm_diff"] == pytest.approx(step, rel=1e-12)
    assert all(w["norm_diff"] == 0 for n, w in rows.items() if n != "features.3")


class Planted(nn.Module):
    """A layer whose output exceeds float16's 65504 (x 1e5 after a bounded input)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.amplify = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 3)
        with torch.no_grad():
            self.amplify.weight.copy_(torch.eye(8) * 1e5)
            self.amplify.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.amplify(torch.tanh(self.fc1(x))) * 1e-5))


def test_float16_names_the_layer_whose_values_overflow() -> None:
    torch.manual_seed(0)
    model = Planted().eval()
    x = torch.randn(4, 8)
    before = model_state(model)
    res = im.compare(model, x, against_dtype="float16")
    assert_unchanged(model, before)
    a = model.amplify(torch.tanh(model.fc1(x)))
    assert (a.abs() > 65504).any()
    assert res.overflow_layers == ("amplify",)
    row = next(r for r in res.layers if r.name == "amplify")
    assert row.overflow == int((a.abs() > 65504).sum()) and row.status == "nonfinite"
    assert res.nonfinite_origin_b == "amplify" and res.nonfinite_origin_a is None
    assert res.first_divergent == "amplify"
    assert "overflow (values of A beyond B's dtype's range) in: amplify" in res.text()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def test_dynamic_quantization_errors_equal_the_hand_computed_ones() -> None:
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(6, 16)
    res = im.compare(model, x, against="quantized", tolerance=1e-2)
    import copy

    q = quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():  # each side end to end, layer by layer, by hand
        a1, b1 = model.fc1(x), q.fc1(x)
        a2, b2 = model.act(a1), q.act(b1)
        a3, b3 = model.fc2(a2), q.fc2(b2)
    rows = {r.name: r for r in res.layers}
    for name, a, b in (("fc1", a1, b1), ("act", a2, b2), ("fc2", a3, b3)):
        d = (a - b).double()
        assert rows[name].relative_error == pytest.approx(float(d.norm() / a.double().norm()), rel=1e-5), name
        assert rows[name].max_abs_error == pytest.approx(float(d.abs().max()), rel=1e-5), name
        cos = float((a.double().flatten() @ b.double().flatten()) / (a.double().norm() * b.double().norm()))
        assert 1 - rows[name].cosine == pytest.approx(1 - cos, rel=1e-3), name
        assert rows[name].relative_error > 0
    assert res.outputs[0].max_abs_change == pytest.approx(float((a3 - b3).abs().max()), rel=1e-5)


@pytest.mark.slow
def test_export_and_torchscript_of_a_small_cnn_are_exact(models_py) -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    before = model_state(model)
    for way in ("export", "torchscript"):
        res = im.compare(model, torch.randn(2, 3, 8, 8), against=way)
        assert [r.status for r in res.layers] == ["equal"] * 7, way
        assert res.matched == 7
    assert_unchanged(model, before)


@pytest.mark.slow
def test_text_model_gpt2(cli, tmp_path) -> None:
    from fixtures.text_models import save_text_model

    folder = save_text_model("gpt2", tmp_path / "gpt2")
    r = cli(["compare", str(folder), "--against-dtype", "bfloat16", "--text", "the movie was good", "--json"])
    doc = _doc(r)
    assert r.exit_code == 0 and doc["matched"] > 20
    assert doc["first_divergent"] == "transformer.wte"  # bfloat16 rounds the embedding first
    logits = next(o for o in doc["outputs"] if o["key"] == "logits")
    assert 0 < logits["relative_error"] < 0.05 and logits["top1_agreement"] is not None
    r = cli(["compare", str(folder), str(folder), "--text", "the movie was good", "--json"])
    assert all(row["status"] == "equal" for row in _doc(r)["layers"])


@pytest.mark.slow
def test_detector_against_another_detector(cli, tmp_path) -> None:
    p = tmp_path / "dets.py"
    p.write_text("from fixtures.dense import tiny_detector\n"
                 "def detector():\n    return tiny_detector()\n"
                 "def untrained():\n    return tiny_detector(0)\n")
    r = cli(["compare", f"{p}:detector", f"{p}:detector", "--input-size", "3x64x64", "--json"])
    doc = _doc(r)
    assert doc["matched"] > 10 and all(row["status"] == "equal" for row in doc["layers"])
    r = cli(["compare", f"{p}:detector", f"{p}:untrained", "--input-size", "3x64x64", "--json"])
    doc = _doc(r)
    assert doc["first_divergent"] == doc["layers"][0]["name"]


def test_files_report_html_and_picture(cli, models_py, checkpoints, tmp_path) -> None:
    pa, pb, _, _ = checkpoints
    out = tmp_path / "out"
    r = cli(["compare", f"{models_py}:TinyCNN", "--checkpoint", str(pa), "--against-checkpoint", str(pb),
             "--input-size", "3x8x8", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["compare_depth.png", "report.html", "report.json", "report.txt"]
    html = (out / "report.html").read_text()
    assert "features.3" in html and "relative error" in html
    assert "first divergent layer: features.3" in (out / "report.txt").read_text()


@pytest.mark.parametrize("args, code, message", [
    (["--against-device", "cuda"], 2, "CUDA is not available"),
    ([], 2, "compare needs side B"),
    (["--against-dtype", "float16", "--against", "export"], 2, "compare one thing at a time"),
    (["--against", "onnx"], 2, "--against 'onnx' is not one of compiled, export, torchscript, quantized"),
    (["--against-train", "--weights-only"], 2, "--weights-only compares two models"),
    (["--against-dtype", "float16", "--tolerance", "-1"], 2, "--tolerance must be"),
])
def test_errors_are_one_line(cli, models_py, args, code, message) -> None:
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = cli(["compare", f"{models_py}:TinyCNN", "--input-size", "3x8x8", *args])
    assert r.exit_code == code, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_map_file_errors_and_use(cli, models_py, tmp_path) -> None:
    bad = tmp_path / "map.json"
    bad.write_text("{oops")
    r = cli(["compare", f"{models_py}:TinyCNN", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--map", str(bad)])
    assert r.exit_code == 4 and "is not JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"fc": "fc"}))
    r = cli(["compare", f"{models_py}:TinyCNN", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--map",
             str(good), "--json"])
    assert _doc(r)["matched_by"] == {"map": 1, "name": 6}


def test_model_unchanged_when_side_b_fails() -> None:
    class NoExport(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if float(x.sum()) > 0:  # data-dependent control flow: torch.export refuses it
                return self.fc(x)
            return -self.fc(x)

    model = NoExport().eval()
    before = model_state(model)
    from inspect_model.errors import ModelRuntimeError

    with pytest.raises(ModelRuntimeError, match="--against export: torch could not make"):
        im.compare(model, torch.ones(1, 4), against="export")
    assert_unchanged(model, before)


@pytest.mark.slow
def test_help_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom inspect_model.cli.app import main\ntry:\n    main(['compare', '--help'])\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False" and "--against-dtype" in out


def test_a_config_file_cannot_name_a_code_running_side_b(cli, models_py, tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[compare]\nagainst-model = "{models_py}:TinyCNN"\n')
    r = cli(["compare", "resnet18", "--weights", "none", "--config", str(cfg)])
    assert r.exit_code == 2 and "whose loading runs code" in r.stderr and "Traceback" not in r.stderr


def test_train_mode_parts_company_at_the_first_batch_norm() -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    before = model_state(model)
    res = im.compare(model, torch.randn(4, 3, 8, 8), against_train=True)
    assert_unchanged(model, before)  # A's running statistics untouched: the copy absorbed the update
    rows = {r.name: r for r in res.layers}
    assert rows["features.0"].status == "equal" and res.first_divergent == "features.1"
    assert res.against == "train"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_against_device_cuda() -> None:
    torch.manual_seed(0)
    res = im.compare(TinyCNN().eval(), torch.randn(2, 3, 8, 8), against_device="cuda")
    assert res.against == "device:cuda" and max(r.relative_error for r in res.layers) < 1e-2
