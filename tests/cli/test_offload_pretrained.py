"""Pretrained torchvision and timm weights placed block by block (issue 37).

Under ``--offload``/``--device-map`` a pretrained model is built empty and its cached weights file
(torchvision: TORCH_HOME/hub/checkpoints; timm: the Hugging Face cache) is read like
``--checkpoint``: memory-mapped, ``weights_only=True``, one block at a time. Offline: seeded
weights are written where the caches look. The placed numbers are the resident ones, bit for bit;
a file whose names are not the model's is built whole as before; peak memory stays near one block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

import inspect_model as im  # noqa: E402
from inspect_model.run.options import InputOptions, ModelOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAT = str(ROOT / "sample_images" / "cat.jpg")


def _cache_resnet18(home: Path, seed: int = 5) -> str:
    """A seeded resnet18 state dict where torchvision's DEFAULT weights are cached under ``home``."""
    import torchvision
    from torchvision.models import ResNet18_Weights

    from inspect_model.loading.sources.torchvision import weights_cache_path

    os.environ["TORCH_HOME"] = str(home)
    path = weights_cache_path(ResNet18_Weights.DEFAULT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.manual_seed(seed)
    model = torchvision.models.resnet18()
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture
def cached_resnet18(tmp_path, monkeypatch) -> str:
    from inspect_model.loading import hub_weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    path = _cache_resnet18(tmp_path / "th")
    real = hub_weights.sha256_file(path)  # the stand-in cannot have the real hash (checked in test_hostile)
    monkeypatch.setattr(hub_weights, "expected_prefix", lambda p: real[:8] if p == path else None)
    return path


def _layers(model: str, **kw) -> dict:
    return im.activations(None, model_options=ModelOptions(model, weights="DEFAULT", **kw),
                          inputs=InputOptions([CAT])).to_dict()


@pytest.mark.parametrize("where", [{"offload": True}, {"device_map": "auto"}])
def test_pretrained_torchvision_weights_placed_give_the_resident_numbers(cached_resnet18, where):
    resident, placed = _layers("resnet18"), _layers("resnet18", **where)
    assert set(placed["options"]["placement"].values()) == ({"disk"} if "offload" in where else {"cpu"})
    assert len(placed["layers"]) > 20
    assert json.dumps(placed["layers"], sort_keys=True) == json.dumps(resident["layers"], sort_keys=True)


def test_pretrained_torchvision_weights_are_read_block_by_block(cached_resnet18, monkeypatch):
    from inspect_model.loading import blockwise
    from inspect_model.loading.placement import Placement
    from inspect_model.loading.sources import load_model

    blocks: list[int] = []
    real = blockwise.materialise

    def counting(model, dmap, *a, values=None, **k):
        def read(names):
            got = values(names)
            blocks.append(len(got))
            return got

        return real(model, dmap, *a, values=read, **k)

    monkeypatch.setattr(blockwise, "materialise", counting)
    loaded = load_model("resnet18", weights="DEFAULT", placement=Placement(offload=True))
    assert any(n == f"pretrained weights {cached_resnet18} read block by block" for n in loaded.notes)
    assert len(blocks) > 5 and sum(blocks) == len(torch.load(cached_resnet18, weights_only=True))
    assert all(p.device.type == "meta" for p in loaded.model.parameters())  # all on the disk


def test_a_bad_hash_is_refused_placed_too(tmp_path, monkeypatch):
    from inspect_model.errors import ModelLoadError

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    _cache_resnet18(tmp_path / "th")  # its name's sha256 prefix is the real file's, not this one's
    with pytest.raises(ModelLoadError, match="does not match its sha256 prefix"):
        _layers("resnet18", offload=True)


def test_timm_pretrained_weights_placed_give_the_resident_numbers(tmp_path, monkeypatch):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    from inspect_model.loading.placement import Placement
    from inspect_model.loading.sources import load_model

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(7)
    sd = {k: v.contiguous() for k, v in timm.create_model("test_convnext.r160_in1k").state_dict().items()}
    snap = home / "hub" / "models--timm--test_convnext.r160_in1k"
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text("0" * 40)
    (snap / "snapshots" / ("0" * 40)).mkdir(parents=True)
    save_file(sd, str(snap / "snapshots" / ("0" * 40) / "model.safetensors"))
    resident, placed = _layers("timm:test_convnext"), _layers("timm:test_convnext", offload=True)
    assert set(placed["options"]["placement"].values()) == {"disk"}
    assert json.dumps(placed["layers"], sort_keys=True) == json.dumps(resident["layers"], sort_keys=True)
    loaded = load_model("timm:test_convnext", weights="DEFAULT", placement=Placement(offload=True))
    assert any(n.startswith("pretrained weights ") and n.endswith(" read block by block") for n in loaded.notes)
    # A head resized with --model-arg does not match the file: built whole, as before, and still placed.
    resized = load_model("timm:test_convnext", weights="DEFAULT", model_args={"num_classes": 7},
                         placement=Placement(offload=True))
    assert not any("read block by block" in n for n in resized.notes)
