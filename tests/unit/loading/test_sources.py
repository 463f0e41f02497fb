"""The model-source registry (issue 23, item 4): a new source is one module and one entry;
each source says what it knows (task, class names, the CAM layer it declares)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import inspect_model as im
from inspect_model.errors import ModelLoadError, UsageError
from inspect_model.loading import sources
from inspect_model.loading.loaded import LoadedModel, LoadRequest, ModelSource, infer_task


class ToySource:
    """A test-only source: ``toy:NAME`` builds a tiny CNN that knows its two classes."""

    name = "toy"
    runs_code = False

    def claims(self, spec: str) -> bool:
        return spec.startswith("toy:")

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(4, 2))
        return LoadedModel(model=model.eval().to(request.device), name=spec, source="toy",
                           categories=["cat", "dog"], input_sizes=[(3, 16, 16)], device=request.device,
                           cam_layer="0")  # the search would pick "1" (the ReLU)


@pytest.fixture
def toy_source():
    im.register_source(ToySource())  # the one registry entry
    yield
    sources.unregister_source("toy")


def test_toy_source_is_a_model_source_and_wins_over_module_specs(toy_source) -> None:
    assert isinstance(ToySource(), ModelSource)
    assert sources.find_source("toy:thing").name == "toy"  # not package `toy`, attribute `thing`
    assert sources.SOURCES[0].name == "toy"


def test_toy_source_in_the_cli(toy_source, cli) -> None:
    r = cli(["summary", "toy:thing"])
    assert r.exit_code == 0, r.stderr
    assert "Model: toy:thing" in r.stdout and "Conv2d" in r.stdout
    r = cli(["cam", "toy:thing", "--json", "--target", "dog"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"] == "toy:thing"
    maps = doc["images"][0]["maps"]
    assert maps[0]["target"]["label"] == "dog" and maps[0]["layer"] == "0"  # the layer the source declares


def test_toy_source_in_the_api(toy_source) -> None:
    loaded = im.load_model("toy:thing")
    assert loaded.source == "toy" and loaded.categories == ["cat", "dog"] and loaded.task == "classification"
    res = im.summary("toy:thing")
    assert res.to_dict()["model"] == "toy:thing"


def test_a_source_must_follow_the_protocol() -> None:
    with pytest.raises(TypeError, match="not a model source"):
        im.register_source(object())


def test_every_builtin_source_claims_its_specs(tmp_path: Path, models_py: Path) -> None:
    cases = {"resnet18": "torchvision", "torchvision:vit_b_16": "torchvision", "timm:resnet18": "timm",
             "hf:acme/tiny": "hf", f"{models_py}:TinyCNN": "file", "os.path:join": "module",
             "nets.py": "file"}
    for spec, name in cases.items():
        assert sources.find_source(spec).name == name, spec
    ts = tmp_path / "net.ts"
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(ts))
    assert sources.find_source(str(ts)).name == "torchscript"
    pickled = tmp_path / "whole.pt"
    torch.save(nn.Linear(2, 2), pickled)
    assert sources.find_source(str(pickled)).name == "pickled"
    with pytest.raises(ModelLoadError, match="does not exist"):
        sources.find_source(str(tmp_path / "missing.pt"))


def test_code_running_sources_are_marked(tmp_path: Path, models_py: Path) -> None:
    assert sources.code_running(f"{models_py}:TinyCNN") == "file"
    assert sources.code_running("subprocess:run") == "module"
    assert sources.code_running("resnet18") is None and sources.code_running("timm:resnet18") is None
    assert sources.code_running("hf:acme/tiny") is None


@pytest.mark.parametrize(("name", "task", "family"), [
    ("resnet18", "classification", "classification"),
    ("fasterrcnn_mobilenet_v3_large_fpn", "detection", "detection"),
    ("lraspp_mobilenet_v3_large", "segmentation", "segmentation"),
    ("r3d_18", "video", "video"),
    ("raft_small", "optical_flow", "optical_flow"),
    ("quantized_mobilenet_v2", "quantized", "quantization")])
def test_torchvision_task_from_its_sub_registry(name: str, task: str, family: str) -> None:
    loaded = im.load_model(name, weights="none", device="meta")
    assert (loaded.task, loaded.family) == (task, family)


def test_task_of_user_code_follows_the_torchvision_class(tmp_path: Path) -> None:
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    assert infer_task(nn.Linear(2, 2)) == "classification"

    class Mine(type(lraspp_mobilenet_v3_large(weights=None, weights_backbone=None))):  # type: ignore[misc]
        pass

    assert infer_task(Mine.__new__(Mine)) == "segmentation"  # a subclass in the user's own module
    f = tmp_path / "seg.py"
    f.write_text("from torchvision.models.segmentation import lraspp_mobilenet_v3_large\n"
                 "def build():\n    return lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)\n")
    loaded = im.load_model(f"{f}:build", device="meta")
    assert loaded.task == "segmentation" and loaded.name == "seg.py:build"


def test_weights_typo_lists_default_once_and_suggests_none(cli) -> None:
    r = cli(["summary", "resnet18", "--weights", "nonee"])
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert line.count("\n") == 0 and line.count("DEFAULT") == 1
    assert "did you mean 'none'?" in line, line
    with pytest.raises(UsageError, match="did you mean 'IMAGENET1K_V1'"):
        im.load_model("resnet18", weights="IMAGENET1K_V9", device="meta")
    assert im.load_model("resnet18", weights="none", device="meta").weights is None


def test_user_model_titled_by_file_and_attribute(cli, models_py: Path) -> None:
    r = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] == "Model: user_models.py:TinyCNN"
    assert im.load_model(f"{models_py}:TinyCNN").name == "user_models.py:TinyCNN"


def test_layer_auto_reads_timm_feature_info_not_class_names() -> None:
    timm = pytest.importorskip("timm")
    from inspect_model.methods.cam.layers import auto_layer

    x = torch.rand(1, 3, 64, 64)
    for arch, want in (("test_efficientnet", None), ("test_resnet", None), ("test_convnext", None)):
        model = timm.create_model(arch, pretrained=False).eval()
        want = model.feature_info[-1]["module"]
        assert auto_layer(model, x) == want, arch
        loaded = im.load_model(f"timm:{arch}", weights="none")
        assert loaded.cam_layer == want and loaded.task == "classification"

    class Renamed(nn.Module):  # no timm class name: only the declaration counts
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3)
            self.b = nn.Conv2d(4, 4, 3)
            self.feature_info = [{"module": "a", "num_chs": 4, "reduction": 1}]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x)).mean((2, 3))

    assert auto_layer(Renamed(), x) == "a"  # the search alone would pick "b"


def test_timm_model_args_that_read_files_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("timm")
    with pytest.raises(UsageError, match="checkpoint_path is not passed to timm"):
        im.load_model("timm:test_resnet", weights="none", model_args={"checkpoint_path": str(tmp_path / "x.pth")})


def test_api_module_instances_get_their_task() -> None:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    from inspect_model.run.options import ModelOptions, load

    det = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None)
    assert load(ModelOptions(det)).task == "detection"
    assert load(ModelOptions(nn.Linear(2, 2))).task == "classification"
