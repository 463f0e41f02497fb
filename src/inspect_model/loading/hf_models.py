"""Hugging Face transformers models: ``hf:ORG/NAME`` and directories written by ``save_pretrained``.

Every file (config.json, the safetensors weights, preprocessor_config.json) is resolved
through :mod:`inspect_model.loading.hub_models` (cache first, offline switches honoured), so
transformers itself only ever reads a local directory: no network, and ``use_safetensors``
means no pickle is read. The Auto class follows the config: image classification where its
``architectures`` say ``...ForImageClassification``, the base model otherwise. Class names
come from ``id2label``; preprocessing from the image processor's config, mapped onto
:class:`~inspect_model.loading.inputs.Preprocess`. Outputs stay ModelOutput dataclasses:
the engine flattens them by field name and ``logits`` is the scored output
(:func:`inspect_model.methods.targets.select_output`). Text models (no image size in the
config, a ``vocab_size``) get seeded token ids below the vocabulary size as their input.
"""

from __future__ import annotations

import json
import os
from typing import Any

from inspect_model.errors import ModelLoadError, UsageError
from inspect_model.loading.hub_models import hub_file, require, short_reason
from inspect_model.loading.inputs import PRESETS, Preprocess
from inspect_model.loading.models import LoadedModel

# PIL's resampling codes, as image processors store them (PIL.Image.Resampling).
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
TEXT_SEQ_LEN = 128  # token ids per sample for text models without --input-size


def _local_dir(spec: str, weights: bool) -> tuple[str, str]:
    """``(display name, local directory holding config.json and the weights)``."""
    ref = spec.removeprefix("hf:")
    if os.path.isdir(ref):
        if not os.path.isfile(os.path.join(ref, "config.json")):
            raise ModelLoadError(f"{ref} has no config.json; give a directory written by save_pretrained")
        return ref, ref
    repo = ref.split("@")[0]
    if repo.count("/") > 1 or not all(repo.split("/")):
        raise UsageError(f"'{spec}' is not hf:ORG/NAME (a Hugging Face model id) nor a directory")
    name = f"hf:{ref}"
    cfg = hub_file(ref, ["config.json"], what=f"the config of {name}")
    assert cfg is not None
    folder = os.path.dirname(cfg)
    if weights:
        _weights_files(ref, name)
    hub_file(ref, ["preprocessor_config.json"], what=f"the image processor of {name}", required=False)
    return name, folder


def _weights_files(repo: str, name: str) -> None:
    """Bring the safetensors weights (one file, or an index and its shards) into the cache."""
    what = f"the weights of {name}"
    path = hub_file(repo, ["model.safetensors", "model.safetensors.index.json"], what=what)
    assert path is not None
    if path.endswith(".index.json"):
        with open(path, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        for shard in shards:
            hub_file(repo, [shard], what=what)


def _has_weights(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("model.safetensors", "model.safetensors.index.json"))


def _auto_class(transformers: Any, config: Any) -> tuple[Any, str]:
    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForImageClassification") for a in archs):
        return transformers.AutoModelForImageClassification, "classification"
    # Detection / segmentation heads (issue 24): the model whose output has boxes or masks.
    if any(a.endswith("ForObjectDetection") for a in archs):
        return transformers.AutoModelForObjectDetection, "detection"
    if any(a.endswith("ForSemanticSegmentation") for a in archs):
        return transformers.AutoModelForSemanticSegmentation, "segmentation"
    return transformers.AutoModel, "base"


def preprocess_from_processor(d: dict[str, Any]) -> tuple[Preprocess, list[str]]:
    """An image processor's config (preprocessor_config.json) as a :class:`Preprocess`.

    ``size`` is ``{"height", "width"}`` (resize both sides: squash), or ``{"shortest_edge"}``
    (shorter side; with ``crop_pct`` below 384 ConvNeXt-style resize to ``size / crop_pct``
    then crop ``size``), optionally followed by a centre crop of ``crop_size``."""
    notes: list[str] = []
    normalize = d.get("do_normalize", True)
    mean = tuple(d.get("image_mean") or PRESETS["imagenet"]["mean"]) if normalize else (0.0, 0.0, 0.0)
    std = tuple(d.get("image_std") or PRESETS["imagenet"]["std"]) if normalize else (1.0, 1.0, 1.0)
    interp = _RESAMPLE.get(int(d.get("resample", 2) or 2), "bilinear")
    size = d.get("size") or {"shortest_edge": 224}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    crop_size = d.get("crop_size")
    if isinstance(crop_size, int):
        crop_size = {"height": crop_size, "width": crop_size}
    crop = int(crop_size["height"]) if d.get("do_center_crop") and crop_size else None
    squash = False
    if "shortest_edge" in size:
        side = int(size["shortest_edge"])
        pct = d.get("crop_pct")
        if pct and crop is None and side < 384:
            resize, crop = int(side / float(pct)), side
        elif pct and crop is None:
            resize, crop, squash = side, side, True  # ConvNeXt's processor warps to side x side at 384+
        else:
            resize, crop = side, crop or side
    else:
        h, w = int(size.get("height", 224)), int(size.get("width", 224))
        if h != w:
            notes.append(f"the image processor resizes to {h}x{w}; images are resized to {min(h, w)} squares")
        resize, crop, squash = min(h, w), crop or min(h, w), True
    if d.get("do_resize") is False:
        notes.append("the image processor does not resize; images are resized to the model's input size")
    return Preprocess(resize=resize, crop=crop, mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
                      interpolation=interp, source="image processor config", squash=squash), notes


def _input_size(config: Any, pre: Preprocess | None) -> tuple[int, ...] | None:
    image = getattr(config, "image_size", None)
    channels = int(getattr(config, "num_channels", 3) or 3)
    if isinstance(image, (list, tuple)) and image:
        return (channels, int(image[0]), int(image[-1]))
    if isinstance(image, int):
        return (channels, image, image)
    if pre is not None and pre.crop:
        return (channels, pre.crop, pre.crop)
    return None


def load_hf(spec: str, *, weights: str | None = None, device: str = "cpu") -> LoadedModel:
    """Build ``hf:ORG/NAME`` (or a ``save_pretrained`` directory) on ``device``."""
    import torch

    transformers = require("transformers")
    w = (weights or "none").strip()
    if w.lower() not in ("none", "random", "", "default"):
        raise UsageError(f"--weights {w}: Hugging Face models take DEFAULT (the repo's weights) or none; "
                         "pin a revision as hf:ORG/NAME@REVISION")
    pretrained = w.lower() == "default"
    name, folder = _local_dir(spec, pretrained)
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the config of {name}: {short_reason(exc)}") from exc
    auto, kind = _auto_class(transformers, config)
    if pretrained and not _has_weights(folder):
        raise ModelLoadError(f"{name} has no model.safetensors (weights in pickle files are not read); "
                             "run with --weights none, or save it again with save_pretrained(safe_serialization=True)")
    try:
        if pretrained and device != "meta":  # on meta no value is read
            model = auto.from_pretrained(folder, local_files_only=True, use_safetensors=True)
            model = model.to(device)
        else:
            with torch.device(device):
                model = auto.from_config(config)
    except Exception as exc:
        raise ModelLoadError(f"cannot build {name} ({type(config).__name__}, {auto.__name__}): "
                             f"{type(exc).__name__}: {short_reason(exc)}") from exc
    model.eval()
    notes: list[str] = []
    pre = None
    proc = os.path.join(folder, "preprocessor_config.json")
    if os.path.isfile(proc):
        with open(proc, encoding="utf-8") as f:
            pre, pre_notes = preprocess_from_processor(json.load(f))
        notes.extend(pre_notes)
    size = _input_size(config, pre)
    vocab = None
    if size is None and getattr(config, "vocab_size", None):
        vocab = int(config.vocab_size)
        seq = min(TEXT_SEQ_LEN, int(getattr(config, "max_position_embeddings", TEXT_SEQ_LEN) or TEXT_SEQ_LEN))
        size = (seq,)
    cats = None
    id2label = getattr(config, "id2label", None) or {}
    n = getattr(config, "num_labels", None)
    if kind in ("classification", "detection", "segmentation") and id2label and len(id2label) == n:
        cats = [str(id2label.get(i, id2label.get(str(i), i))) for i in range(n)]
    loaded = LoadedModel(
        # A detector or segmenter keeps family "custom": it takes one tensor, not torchvision's
        # list of images; its task is read from the module (methods/tasks.py).
        model=model, name=name, source="hf",
        family="text" if vocab else "classification" if cats and kind == "classification" else "custom",
        weights="DEFAULT" if pretrained else None, categories=cats, transforms=pre,
        input_sizes=[size] if size else None, device=device, notes=notes, token_vocab=vocab,
    )
    return loaded
