"""Issue 35, "Done when": a toy CAM method, a toy attribution method, a toy attention method
and a toy command, each one module (tests/fixtures/toys/), are seen in --help, completion,
--json, the schema and report.html, with nothing else edited."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import shutil

import jsonschema
import pytest
import torch

TOYS = ("fixtures.toys.toy_cam", "fixtures.toys.toy_attribution", "fixtures.toys.toy_attention",
        "fixtures.toys.toy_command")
ROOT = Path(__file__).resolve().parents[2]
IMAGES = [str(ROOT / "sample_images" / "cat.jpg")]


@pytest.fixture
def toys() -> Any:
    import inspect_model as im
    from inspect_model import registry
    from inspect_model.cli import app
    from inspect_model.methods.attention import base as attention_base
    from inspect_model.methods.attributions import base as attribution_base
    from inspect_model.methods.cam import base as cam_base

    for name in TOYS:
        sys.modules.pop(name, None)
        importlib.import_module(name)
    app.sync_commands(rebuild=True)  # the help texts read the method registries anew
    yield
    cam_base.unregister("toymeancam")
    attribution_base.unregister("toy-sign")
    attention_base.unregister("toy-last")
    registry.unregister("toy-norms")
    app.sync_commands(rebuild=True)
    im.__dict__.pop("toy_norms", None)


def _run(cli: Any, args: list[str]) -> Any:
    r = cli(args)
    assert r.exit_code == 0, r.stderr
    return r


def test_toys_appear_in_help_and_completion(toys: Any, cli: Any) -> None:
    from inspect_model.cli import completion

    assert "toymeancam" in _run(cli, ["cam", "--help"]).stdout
    assert "toy-sign" in _run(cli, ["attributions", "--help"]).stdout
    top = _run(cli, ["--help"]).stdout
    assert "toy-norms" in top and "the norm of each input" in top
    assert "--power" in _run(cli, ["toy-norms", "--help"]).stdout
    assert completion.complete_method("toy", "cam") == ["toymeancam"]
    assert completion.complete_method("toy", "attributions") == ["toy-sign"]
    assert "toymeancam" in completion.complete_method("", "attention")  # one pass, no classifier: attention adds it
    assert "toy-last" in _run(cli, ["attention", "--help"]).stdout
    assert completion.complete_method("toy", "attention") == ["toy-last", "toymeancam"]
    assert "toy-norms" in completion.command_names()


def test_toys_run_and_their_reports_validate(toys: Any, cli: Any, models_py: Path, tmp_path: Path) -> None:
    from inspect_model.schemas import load_schema
    from inspect_model.schemas.generate import options_schema

    model = f"{models_py}:TinyCNN"
    base = [model, "--input-size", "3x8x8", "--batch-size", "2"]
    # the toy CAM: --json, the schema's method enum, report.html
    cam = json.loads(_run(cli, ["cam", *base, "--method", "toymeancam,gradcam", "--layer", "features.3",
                                "--json"]).stdout)
    methods = [m["method"] for m in cam["images"][0]["maps"]]
    assert methods == ["gradcam", "toymeancam"]
    toy_map = cam["images"][0]["maps"][1]
    assert toy_map["class_independent"] is True  # read from the method's property
    schema = load_schema("cam")
    assert "toymeancam" in schema["$defs"]["method"]["enum"]
    jsonschema.Draft202012Validator(schema).validate(cam)
    # the toy attribution: its maps are the sign of the gradient (checked against autograd)
    attr = json.loads(_run(cli, ["attributions", *base, "--method", "toy-sign,gradient", "--json"]).stdout)
    recs = {m["method"]: m for m in attr["images"][0]["maps"]}
    assert set(recs) == {"gradient", "toy-sign"}
    schema = load_schema("attributions")
    assert "toy-sign" in schema["$defs"]["method"]["enum"]
    jsonschema.Draft202012Validator(schema).validate(attr)
    # the toy command: --json, its options in the generated schema
    norms = json.loads(_run(cli, ["toy-norms", *base, "--power", "1", "--json"]).stdout)
    assert norms["command"] == "toy-norms" and norms["options"]["power"] == 1
    assert "power" in options_schema("toy-norms")["properties"]
    toy_schema = load_schema("toy-norms")  # generated from its record types (report=NormsReport)
    assert toy_schema["properties"]["images"]["items"]["properties"]["norm"]["minimum"] == 0
    jsonschema.Draft202012Validator(toy_schema).validate(norms)
    # report.html of each: the toy's rows and its own table
    for args, name, expect in ((["cam", "--method", "toymeancam", "--layer", "features.3"], "cam", "toymeancam"),
                               (["attributions", "--method", "toy-sign"], "attr", "toy-sign"),
                               (["toy-norms"], "norms", "Norms of the inputs")):
        out = tmp_path / name
        _run(cli, [args[0], *base, *args[1:], "-o", str(out), "-q"])
        assert expect in (out / "report.html").read_text(encoding="utf-8")


def test_the_toy_attribution_is_the_sign_of_the_gradient(toys: Any) -> None:
    import inspect_model as im
    from fixtures.models import TinyCNN

    torch.manual_seed(0)
    net = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8)
    res = im.attribute(net, x, target=[1, 3], settings=im.AttributionSettings(methods=("toysign", "gradient")))
    torch.testing.assert_close(res.maps["toy-sign"], res.maps["gradient"].sign())
    xr = x.clone().requires_grad_(True)
    net(xr)[torch.arange(2), torch.tensor([1, 3])].sum().backward()
    torch.testing.assert_close(res.maps["toy-sign"][:, 0], xr.grad.sign())


@pytest.fixture
def vit(tmp_path: Path) -> str:
    p = tmp_path / "attn_models.py"
    shutil.copy(ROOT / "tests" / "fixtures" / "attention_models.py", p)
    return f"{p}:tiny_vit"


def test_the_toy_attention_method_runs_and_is_reported(toys: Any, cli: Any, vit: str, tmp_path: Path) -> None:
    from inspect_model.schemas import load_schema

    base = ["attention", vit, *IMAGES, "--input-size", "3x32x32"]
    out = tmp_path / "attn"
    doc = json.loads(_run(cli, [*base, "-m", "toylast,rollout,raw", "-o", str(out), "--json", "-q"]).stdout)
    assert doc["methods"] == ["raw", "rollout", "toy-last"]  # the family's order; the alias resolved
    maps = {m["method"]: m for m in doc["images"][0]["maps"]}
    assert maps["toy-last"]["layer"] == "all"
    schema = load_schema("attention")
    assert "toy-last" in schema["$defs"]["method"]["enum"]
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert "toy-last @ all" in (out / "report.html").read_text(encoding="utf-8")
    assert (out / "images" / "0000-cat" / f"toy-last.c{doc['images'][0]['target']['class']}.png").is_file()
    # `all` takes it; its map is raw's of the last layer, heads averaged (checked by the API)
    assert "toy-last" in json.loads(_run(cli, [*base, "-m", "all", "--json", "-q"]).stdout)["methods"]
    import inspect_model as im

    res = im.attention(vit, IMAGES, methods=["toy-last", "raw"], heads="mean",
                       inputs=im.InputOptions(IMAGES, input_size=["3x32x32"]))
    last = list(res.raw)[-1]
    torch.testing.assert_close(res.maps["toy-last"], res.raw[last][:, 0])
    # a token model: the toy's text form (its text_* hooks) gives the last layer's heads-averaged
    # query row, as raw's last layer with --heads mean; without one (``text`` false) one line says so
    pytest.importorskip("transformers")
    from fixtures.text_models import build_model
    from inspect_model.errors import UsageError
    from inspect_model.methods.attention import base as attention_base
    from inspect_model.methods.attention.maps import AttentionOptions
    from inspect_model.methods.attention.text import compute_text_attention

    ids, mask = torch.randint(5, 60, (2, 7), generator=torch.Generator().manual_seed(0)), torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    got = compute_text_attention(build_model("bert", "sdpa"), ids, mask,
                                 options=AttentionOptions(methods=("raw", "toy-last"), heads="mean", query="1"))
    last = got.raw[got.layers[-1]][:, 0]  # (B, L, L): heads averaged
    torch.testing.assert_close(got.values["toy-last"], last[:, 1])
    assert "toy-last" in got.matrices
    toy = attention_base.get("toy-last")
    type(toy).text = False
    try:
        with pytest.raises(UsageError, match="^--method toy-last has no form for token models; those with one: "
                                             "raw, rollout, grad-rollout, legrad$"):
            compute_text_attention(torch.nn.Identity(), torch.ones(1, 3, dtype=torch.long),
                                   options=AttentionOptions(methods=("toy-last",)))
    finally:
        type(toy).text = True
