"""Hugging Face models: ``save_pretrained`` directories and ``hf:ORG/NAME`` from a temporary
HF_HOME cache (no network), the Auto class, id2label, the image processor's preprocessing,
ModelOutput with ``logits`` scored, token ids for BERT-like models, offline errors."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import run_cli
from inspect_model.errors import ModelLoadError
from inspect_model.loading.sources import load_model

LABELS = {0: "cat", 1: "dog", 2: "fox"}
# The PIL-based ViT processor (transformers 5 splits it out; in 4.x it is ViTImageProcessor).
PIL_PROCESSOR = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    """A tiny ViTForImageClassification with its image processor, saved with save_pretrained."""
    torch.manual_seed(3)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=32, num_labels=3, id2label=LABELS,
                                 label2id={v: k for k, v in LABELS.items()})
    model = transformers.ViTForImageClassification(cfg).eval()
    path = tmp_path_factory.mktemp("hf") / "tiny-vit"
    model.save_pretrained(path)
    PIL_PROCESSOR(size={"height": 32, "width": 32}, resample=3,
                                      image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3]).save_pretrained(path)
    return path, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("hf") / "tiny-bert"
    transformers.BertModel(cfg).save_pretrained(path)
    return path


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hfhome"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def _cache_repo(home, repo: str, src) -> None:
    """Copy a save_pretrained directory into the hub cache layout of ``repo``."""
    sha = "1" * 40
    root = home / "hub" / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    shutil.copytree(src, root / "snapshots" / sha)


def test_save_pretrained_directory(vit_dir):
    path, state = vit_dir
    loaded = load_model(str(path), weights="DEFAULT")
    assert loaded.source == "hf" and type(loaded.model).__name__ == "ViTForImageClassification"
    assert loaded.categories == ["cat", "dog", "fox"]
    assert loaded.input_sizes == [(3, 32, 32)]
    got = loaded.model.state_dict()
    assert all(torch.equal(got[k], state[k]) for k in state)
    pre = loaded.transforms
    assert (pre.resize, pre.crop, pre.squash, pre.interpolation) == (32, 32, True, "bicubic")
    assert pre.mean == (0.4, 0.5, 0.6) and pre.std == (0.2, 0.25, 0.3)


def test_preprocessing_equals_the_image_processor(vit_dir):
    """Our Preprocess gives the tensor of transformers' own (PIL) image processor."""
    from PIL import Image

    path, _ = vit_dir
    loaded = load_model(str(path), weights="none")
    proc = PIL_PROCESSOR.from_pretrained(path)
    rng = np.random.default_rng(0)
    img = Image.fromarray((rng.random((45, 70, 3)) * 255).astype("uint8"))
    expected = proc(img, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(loaded.transforms(img), expected, atol=1e-5, rtol=0)


def test_hub_id_from_the_cache_without_network(vit_dir, hf_home, monkeypatch):
    import socket

    import huggingface_hub

    def no_network(*a, **k):
        raise AssertionError("the network was touched")

    path, state = vit_dir
    _cache_repo(hf_home, "acme/tiny-vit", path)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    loaded = load_model("hf:acme/tiny-vit", weights="DEFAULT")
    assert loaded.name == "hf:acme/tiny-vit" and loaded.categories == ["cat", "dog", "fox"]
    got = loaded.model.state_dict()
    assert all(torch.equal(got[k], state[k]) for k in state)


def test_missing_hub_model_offline_is_one_line_exit_3(hf_home):
    res = run_cli(["summary", "hf:acme/nothing-here"])
    assert res.exit_code == 3
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: the config of hf:acme/nothing-here: not in the cache")
    assert str(hf_home / "hub") in err and "HF_HUB_OFFLINE is set" in err


def test_pickled_weights_are_not_read(vit_dir, tmp_path):
    path, _ = vit_dir
    copy = tmp_path / "pickled"
    shutil.copytree(path, copy)
    (copy / "model.safetensors").unlink()
    torch.save({}, copy / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_model(str(copy), weights="DEFAULT")


def test_summary_and_cam_score_logits_with_id2label(vit_dir, tmp_path):
    path, _ = vit_dir
    res = run_cli(["summary", str(path), "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["input_shapes"] == [[1, 3, 32, 32]]
    # The patch embedding: 16 patches x 16 channels x (3 x 8 x 8) MACs, by hand.
    rows = {r["name"]: r for r in doc["layers"]}
    assert rows["vit.embeddings.patch_embeddings.projection"]["macs"] == 16 * 16 * 3 * 8 * 8
    res = run_cli(["cam", str(path), "sample_images/cat.jpg", "--target", "dog", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    m = doc["images"][0]["maps"][0]
    assert m["target"]["label"] == "dog" and m["layer"].endswith(".1.layernorm_before")


def test_scored_output_is_logits():
    from transformers.modeling_outputs import ImageClassifierOutput

    from inspect_model.methods.objectives.targets import select_output

    out = ImageClassifierOutput(loss=torch.tensor(1.0), logits=torch.ones(1, 3), hidden_states=(torch.zeros(1, 2),))
    assert select_output(out, None) is out.logits
    assert select_output(out, "hidden_states/0") is out.hidden_states[0]


def test_bert_takes_token_ids(bert_dir):
    res = run_cli(["summary", str(bert_dir), "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["dtype"] == "int64" and doc["input_shapes"] == [[1, 64]]  # max_position_embeddings
    # By hand, per layer of 64 tokens of width 16: q, k, v, o (4 x 64 x 16 x 16), the MLP
    # (2 x 64 x 16 x 32), attention's two products (2 x 64 x 64 x 16); the pooler 16 x 16.
    per_layer = 4 * 64 * 16 * 16 + 2 * 64 * 16 * 32 + 2 * 64 * 64 * 16
    assert doc["total_macs"] == 2 * per_layer + 16 * 16
    res = run_cli(["activations", str(bert_dir), "--weights", "DEFAULT", "--json"])
    assert res.exit_code == 0, res.stderr
    res = run_cli(["grads", str(bert_dir), "--weights", "DEFAULT", "--json"])  # head-less: no silent target (issue 42)
    assert res.exit_code == 2 and "--target norm" in res.stderr, res.stderr
    res = run_cli(["grads", str(bert_dir), "--weights", "DEFAULT", "--target", "norm", "--json"])
    assert res.exit_code == 0, res.stderr


def test_without_transformers_a_one_line_install_hint(bert_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    res = run_cli(["summary", str(bert_dir)])
    assert res.exit_code == 3
    assert res.stderr.strip().startswith('error: transformers is not installed; `pip install "inspect-model[hf]"`')


def _remote_code_dir(root):
    """A save_pretrained-style folder whose config names its own code (auto_map), for a model
    type transformers does not know: loading it runs configuration_evil.py."""
    path = root / "evil"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "model_type": "evilnet", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"}}))
    (path / "configuration_evil.py").write_text(
        "import os, pathlib\nfrom transformers import PretrainedConfig\n"
        "pathlib.Path(os.environ['EVIL_MARKER']).write_text('ran')\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evilnet'\n")
    (path / "modeling_evil.py").write_text(
        "import torch\nfrom transformers import PreTrainedModel\nfrom .configuration_evil import EvilConfig\n"
        "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n"
        "    def __init__(self, config):\n        super().__init__(config)\n"
        "        self.conv = torch.nn.Conv2d(3, 4, 3)\n        self.fc = torch.nn.Linear(4, 2)\n        self.post_init()\n"
        "    def forward(self, pixel_values):\n        return self.fc(self.conv(pixel_values).mean((2, 3)))\n")
    return path


def test_remote_code_never_runs_without_the_flag_even_with_yes_on_stdin(tmp_path, monkeypatch):
    """Issue 28 (3): transformers would ask on stdin; images on stdin ('-') held 'y'. Now
    trust_remote_code=False is always passed: one line, exit 3, nothing run, nothing on stdout."""
    from conftest import SAMPLE_IMAGES

    marker = tmp_path / "marker"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    path = _remote_code_dir(tmp_path)
    image = min(SAMPLE_IMAGES.glob("*.jpg"))
    for answer in ("y", "yes", "1"):
        r = run_cli(["cam", str(path), "-", "--weights", "none", "--json"], stdin=f"{answer}\n{image}\n")
        assert r.exit_code == 3, r.stderr
        assert r.stdout == "" and not marker.exists()
        line = r.stderr.strip()
        assert "\n" not in line and "--trust-remote-code" in line and "configuration_evil.py" in line, line
    with pytest.raises(ModelLoadError, match="trust-remote-code"):
        load_model(str(path), weights="none")
    assert not marker.exists()
    # With the flag on the command line, the repo's code runs and the model works.
    r = run_cli(["summary", str(path), "--weights", "none", "--trust-remote-code", "--input-size", "3x16x16",
                 "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    assert marker.exists() and "EvilModel" in r.stdout


def test_trust_remote_code_is_refused_in_a_config(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('trust-remote-code = true\n')
    r = run_cli(["summary", "resnet18", "--config", str(cfg)])
    assert r.exit_code == 2 and "trust-remote-code" in r.stderr and "command line" in r.stderr


def test_quiet_silences_transformers_loading_output(vit_dir):
    """Issue 28 (13): --quiet leaves stderr empty (no "Loading weights" bar, no logs); the
    libraries' own settings are put back afterwards."""
    from transformers.utils import logging as tf_logging

    path, _ = vit_dir
    before = (tf_logging.is_progress_bar_enabled(), tf_logging.get_verbosity())
    loud = run_cli(["summary", str(path), "--weights", "DEFAULT", "--device", "cpu"])
    assert loud.exit_code == 0, loud.stderr
    quiet = run_cli(["summary", str(path), "--weights", "DEFAULT", "--device", "cpu", "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout == loud.stdout
    # Issue 39 (10): the libraries' bars show only on a terminal; CliRunner's stderr is not one
    # (tests/cli/test_hub_progress.py shows the bar where it is)
    assert "Loading weights" not in loud.stderr
    assert (tf_logging.is_progress_bar_enabled(), tf_logging.get_verbosity()) == before


def test_task_and_head_follow_the_config_architectures(tmp_path):
    from types import SimpleNamespace

    from inspect_model.loading.sources.hf import _auto_class

    for arch, auto, task in (("ViTForImageClassification", "AutoModelForImageClassification", "classification"),
                             ("DetrForObjectDetection", "AutoModelForObjectDetection", "detection"),
                             ("SegformerForSemanticSegmentation", "AutoModelForSemanticSegmentation",
                              "segmentation"),
                             ("Mask2FormerForUniversalSegmentation", "AutoModelForUniversalSegmentation",
                              "segmentation"),
                             ("VideoMAEForVideoClassification", "AutoModelForVideoClassification", "video"),
                             ("ViTModel", "AutoModel", "custom")):
        cls, got = _auto_class(transformers, SimpleNamespace(architectures=[arch]))
        assert (cls.__name__, got) == (auto, task), arch
    cfg = transformers.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                                       patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                                       mlp_ratios=[2, 2], decoder_hidden_size=8, num_labels=3, id2label=LABELS,
                                       label2id={v: k for k, v in LABELS.items()})
    path = tmp_path / "seg"
    transformers.SegformerForSemanticSegmentation(cfg).save_pretrained(path)
    loaded = load_model(str(path), weights="DEFAULT")
    assert type(loaded.model).__name__ == "SegformerForSemanticSegmentation"
    assert loaded.task == "segmentation" and loaded.categories == ["cat", "dog", "fox"]
    assert loaded.config is not None and loaded.config.model_type == "segformer"


def test_remote_code_of_a_hub_repo_from_the_cache(tmp_path, hf_home, monkeypatch):
    """hf:ORG/NAME with auto_map: refused without the flag; with it, the code files named in
    auto_map come from the cache (offline) and run."""
    marker = tmp_path / "marker"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    _cache_repo(hf_home, "acme/evil", _remote_code_dir(tmp_path))
    r = run_cli(["summary", "hf:acme/evil", "--input-size", "3x16x16"])
    assert r.exit_code == 3 and "--trust-remote-code" in r.stderr and not marker.exists(), r.stderr
    r = run_cli(["summary", "hf:acme/evil", "--input-size", "3x16x16", "--trust-remote-code", "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    assert marker.exists() and "EvilModel" in r.stdout
