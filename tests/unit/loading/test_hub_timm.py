"""``timm:NAME``: weights through timm's pretrained config and the Hugging Face cache (no
network: a file saved into a temporary HF_HOME), timm's preprocessing and class names,
offline errors, the install hint, and MACs against timm's published GMACs."""

from __future__ import annotations

import os
import pickle
import sys

import pytest
import torch

timm = pytest.importorskip("timm")
pytest.importorskip("safetensors")

from conftest import run_cli
from inspect_model.errors import ModelLoadError, UsageError
from inspect_model.loading.sources import load_model

ARCH, TAG = "test_convnext", "r160_in1k"  # timm's own tiny test model (~40k parameters)


def _put_in_hub_cache(home, repo: str, filename: str, write) -> str:
    """Write a file where huggingface_hub keeps it: hub/models--ORG--NAME/snapshots/SHA/FILE."""
    sha = "0" * 40
    root = home / "hub" / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(sha)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True, exist_ok=True)
    write(str(snap / filename))
    return str(snap / filename)


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture
def cached_weights(hf_home):
    """A seeded test_convnext state dict placed in the cache as timm/test_convnext.r160_in1k."""
    from safetensors.torch import save_file

    torch.manual_seed(7)
    ref = timm.create_model(f"{ARCH}.{TAG}", pretrained=False)
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    _put_in_hub_cache(hf_home, f"timm/{ARCH}.{TAG}", "model.safetensors", lambda p: save_file(sd, p))
    return sd


def test_cached_weights_load_without_network(cached_weights, monkeypatch):
    import socket

    import huggingface_hub

    def no_network(*a, **k):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE")  # even online, a cached file is used as is
    loaded = load_model(f"timm:{ARCH}", weights="DEFAULT")
    assert loaded.source == "timm" and loaded.weights == TAG and loaded.name == f"timm:{ARCH}.{TAG}"
    got = loaded.model.state_dict()
    assert set(got) == set(cached_weights)
    assert all(torch.equal(got[k], cached_weights[k]) for k in got)
    assert not loaded.model.training
    # ImageNet-1k head: the first WordNet synonym of each class.
    assert len(loaded.categories) == 1000 and loaded.categories[0] == "tench"
    assert loaded.categories[281] == "tabby"
    assert loaded.input_sizes == [(3, 160, 160)]


def test_preprocessing_equals_timm_transform(cached_weights):
    """Our Preprocess from timm's data config gives timm's own eval transform's tensor."""
    from PIL import Image

    loaded = load_model(f"timm:{ARCH}", weights="DEFAULT")
    cfg = timm.data.resolve_model_data_config(loaded.model)
    expected = timm.data.create_transform(**cfg, is_training=False)
    pre = loaded.transforms
    assert pre.crop == 160 and pre.resize == int(160 / cfg["crop_pct"]) and pre.interpolation == cfg["interpolation"]
    rng = torch.Generator().manual_seed(0)
    arr = (torch.rand(211, 297, 3, generator=rng) * 255).to(torch.uint8).numpy()
    img = Image.fromarray(arr)
    torch.testing.assert_close(pre(img), expected(img), atol=1e-5, rtol=0)


def test_weights_none_builds_on_meta_without_a_file(hf_home):
    loaded = load_model("timm:convnext_tiny", weights="none", device="meta")
    assert loaded.weights is None and loaded.categories is None
    assert next(loaded.model.parameters()).device.type == "meta"
    assert loaded.transforms.crop == 224 and loaded.transforms.interpolation == "bicubic"


def test_tagged_name_without_weights_takes_that_head(hf_home):
    loaded = load_model("timm:convnext_tiny.fb_in22k", weights="none", device="meta")
    assert loaded.model.num_classes == 21841


def test_missing_weights_offline_is_one_line_exit_3(hf_home):
    res = run_cli(["summary", f"timm:{ARCH}", "--weights", "DEFAULT"])
    assert res.exit_code == 3
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: the weights of timm:test_convnext.r160_in1k")
    assert str(hf_home / "hub") in err and "HF_HUB_OFFLINE is set" in err and "--weights none" in err


def test_unknown_tag_and_name(hf_home):
    with pytest.raises(UsageError, match="did you mean 'r160_in1k'"):
        load_model(f"timm:{ARCH}", weights="r160_in2k")
    with pytest.raises(ModelLoadError, match="did you mean 'convnext_tiny'"):
        load_model("timm:convnext_tinyy", weights="none")


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickled_code_in_a_weights_file_is_refused(hf_home):
    def write(p):
        with open(p, "wb") as f:
            torch.save({"x": torch.zeros(1), "evil": _Boom()}, f, pickle_module=pickle)

    _put_in_hub_cache(hf_home, f"timm/{ARCH}.{TAG}", "pytorch_model.bin", write)
    with pytest.raises(ModelLoadError, match="not unpickled"):
        load_model(f"timm:{ARCH}", weights="DEFAULT")


def test_without_timm_a_one_line_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    res = run_cli(["summary", "timm:convnext_tiny"])
    assert res.exit_code == 3
    assert res.stderr.strip().startswith("error: timm is not installed; `pip install \"inspect-model[timm]\"`")
    res = run_cli(["models", "--source", "timm"])
    assert res.exit_code == 3


def test_models_lists_timm():
    res = run_cli(["models", "--source", "timm", "convnext_t*"])
    assert res.exit_code == 0, res.output
    assert "convnext_tiny " in res.stdout and "resnet" not in res.stdout
    res = run_cli(["models", "--source", "timm", "test_convnext.*"])
    assert "test_convnext.r160_in1k" in res.stdout


# GMACs and parameters (M) as timm's model cards publish them ("Model Stats" of
# huggingface.co/timm/<name>, rounded to 0.1). The cards of the augreg ViTs leave out
# attention's two matrix products (2 * N^2 * D MACs per block, N tokens of width D), which
# summary counts; the DeiT cards include them (deit_small 4.6 against vit_small 4.3, one
# architecture), so the ViT rows say how many blocks' attention to take away. What is left
# must lie within the card's rounding (0.05) plus 0.01 GMACs: the cards' counter also counts
# a few element-wise ops (vit_small: 4.24 here without attention, 4.3 on its card).
PUBLISHED = {  # name: (GMACs, M params, (blocks, tokens, width) of uncounted attention or None)
    "convnext_tiny.fb_in1k": (4.5, 28.6, None),
    "resnet50.a1_in1k": (4.1, 25.6, None),
    "efficientnet_b0.ra_in1k": (0.4, 5.3, None),
    "deit_small_patch16_224.fb_in1k": (4.6, 22.1, None),
    "vit_small_patch16_224.augreg_in21k_ft_in1k": (4.3, 22.1, (12, 197, 384)),
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k": (1.1, 5.7, (12, 197, 192)),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_summary_macs_match_timm_published(name):
    from inspect_model.api.summary import summarize_model

    gmacs, mparams, attention = PUBLISHED[name]
    loaded = load_model(f"timm:{name}", weights="none", device="meta")
    res = summarize_model(loaded)
    assert res.error is None and res.device == "meta"
    macs = res.total_macs
    if attention:
        blocks, n, d = attention
        macs -= blocks * 2 * n * n * d
    assert abs(macs / 1e9 - gmacs) <= 0.06
    assert round(res.total_params / 1e6, 1) == pytest.approx(mparams, abs=1e-9)
