"""Every value read from a Hugging Face model folder is checked (issue 41): a bad one in
preprocessor_config.json or config.json is a bad-model error (exit 3) naming the file and
the key; a sharded index naming a shard outside the folder is refused before a byte of it
is read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from inspect_model.errors import ModelLoadError  # noqa: E402
from inspect_model.loading.sources.hf import preprocess_from_processor  # noqa: E402
from inspect_model.loading.sources.hf_values import shard_names  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32, num_labels=3)
    path = tmp_path_factory.mktemp("hfv") / "vit"
    transformers.ViTForImageClassification(cfg).save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "resample": 2, "size": {"height": 32, "width": 32}, "image_processor_type": "ViTImageProcessor"}))
    return path


def _copy(vit: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(vit, out)
    return out


def _edit(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            doc.pop(key, None)
        else:
            doc[key] = value
    path.write_text(json.dumps(doc))


def _bad_model(res, *needles: str) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert res.exit_code == 3 and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, res.stderr)
    assert "unexpected" not in lines[0] and "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ------------------------------------------------------------------ preprocessor_config.json
PROCESSOR_CASES = {
    "a string size": ("size", "224"),
    "a string height": ("size", {"height": "224", "width": 224}),
    "a zero side": ("size", {"shortest_edge": 0}),
    "a huge side": ("size", {"height": 10**9, "width": 10**9}),
    "an unknown resample": ("resample", 42),
    "a string resample": ("resample", "bicubic"),
    "a scalar mean": ("image_mean", 0.5),
    "a mean of strings": ("image_mean", ["a", "b", "c"]),
    "a zero std": ("image_std", [0.5, 0.0, 0.5]),
    "a negative std": ("image_std", [-1, 1, 1]),
    "a std of another length": ("image_std", [0.5, 0.5]),
    "a string crop_pct": ("crop_pct", "0.9"),
    "a string do_normalize": ("do_normalize", "yes"),
    "a list crop size": ("crop_size", [224, 224]),
}


@pytest.mark.parametrize("case", list(PROCESSOR_CASES))
def test_a_bad_processor_value_is_a_bad_model_error_naming_file_and_key(case: str, vit: Path, tmp_path: Path,
                                                                         cli) -> None:
    key, value = PROCESSOR_CASES[case]
    model = _copy(vit, tmp_path)
    changes: dict[str, object] = {key: value}
    if key == "crop_size":
        changes["do_center_crop"] = True
    _edit(model / "preprocessor_config.json", **changes)
    r = cli(["summary", str(model)])
    line = _bad_model(r, "preprocessor_config.json", f"'{key}")
    assert "save the model again" in line or "as many as" in line


def test_good_processor_values_are_read_as_before() -> None:
    pre, _ = preprocess_from_processor({"size": {"shortest_edge": 256}, "crop_size": 224, "do_center_crop": True,
                                        "resample": 3, "image_mean": [0.1, 0.2, 0.3], "image_std": [1, 2, 3]})
    assert (pre.resize, pre.crop, pre.interpolation, pre.mean, pre.std) == (
        256, 224, "bicubic", (0.1, 0.2, 0.3), (1.0, 2.0, 3.0))
    pre, _ = preprocess_from_processor({"size": 224, "crop_pct": 0.875})
    assert (pre.resize, pre.crop) == (256, 224)
    with pytest.raises(ModelLoadError, match="'cfg.json': key 'resample'"):
        preprocess_from_processor({"resample": 9}, "'cfg.json'")


# ------------------------------------------------------------------ config.json
@pytest.mark.parametrize("key,value", [("num_channels", 3.5), ("num_channels", "3"), ("num_channels", 0),
                                       ("num_channels", 10**6), ("image_size", "32"), ("image_size", [0, 32])])
def test_a_bad_config_value_is_a_bad_model_error_naming_file_and_key(key: str, value: object, vit: Path,
                                                                     tmp_path: Path, cli) -> None:
    model = _copy(vit, tmp_path)
    _edit(model / "config.json", **{key: value})
    r = cli(["summary", str(model), "--device", "meta"])
    _bad_model(r, "config.json", f"'{key}'")


# ------------------------------------------------------------------ sharded weights
def _shard(model: Path, name: str, tmp_path: Path) -> None:
    """Turn the folder's single model.safetensors into an index naming ``name``."""
    from safetensors.torch import load_file

    keys = list(load_file(str(model / "model.safetensors")))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: name for k in keys}}))
    target = (model / name).resolve() if not name.startswith("/") else Path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(model / "model.safetensors", target)
    (model / "model.safetensors").unlink()


@pytest.mark.parametrize("name", ["../outside.safetensors", "sub/../../outside.safetensors", "/ABS"])
def test_the_issue_example_a_shard_outside_the_folder_is_refused(name: str, vit: Path, tmp_path: Path, cli) -> None:
    model = _copy(vit, tmp_path)
    name = str(tmp_path / "abs.safetensors") if name == "/ABS" else name
    _shard(model, name, tmp_path)
    r = cli(["summary", str(model), "--weights", "DEFAULT"])
    _bad_model(r, "model.safetensors.index.json", "'weight_map'", "outside the model's folder")


def test_a_shard_linked_out_of_the_folder_is_refused(vit: Path, tmp_path: Path, cli) -> None:
    model = _copy(vit, tmp_path)
    _shard(model, "part-1.safetensors", tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(str(model / "part-1.safetensors"), outside)
    (model / "part-1.safetensors").symlink_to(outside)
    r = cli(["summary", str(model), "--weights", "DEFAULT"])
    _bad_model(r, "'weight_map'", "through a link")


def test_a_shard_inside_the_folder_loads(vit: Path, tmp_path: Path, cli) -> None:
    model = _copy(vit, tmp_path)
    _shard(model, "part-00001-of-00001.safetensors", tmp_path)
    r = cli(["summary", str(model), "--weights", "DEFAULT", "--json"])
    assert r.exit_code == 0, r.stderr


def test_hub_shard_names_are_checked_before_the_cache_is_asked() -> None:
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        shard_names({"weight_map": {"a": "../../x.safetensors"}}, "weights index 'i.json'")
    with pytest.raises(ModelLoadError, match="not file names"):
        shard_names({"weight_map": {"a": ["x"]}}, "weights index 'i.json'")
    assert shard_names({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}, "w") == [
        "m-1.safetensors", "m-2.safetensors"]
