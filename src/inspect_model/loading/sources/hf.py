"""The ``hf`` model source: Hugging Face transformers models, ``hf:ORG/NAME`` and ``save_pretrained`` folders.

Every file (config.json, the safetensors weights, preprocessor_config.json) is resolved
through :mod:`inspect_model.loading.hub_models` (cache first, offline switches honoured), so
transformers itself only ever reads a local directory: no network, and ``use_safetensors``
means no pickle is read. The Auto class and the task follow the config's ``architectures``
(``...ForImageClassification``, ``...ForObjectDetection``, ``...ForSemanticSegmentation``,
``...ForVideoClassification``, text ``...ForSequenceClassification``, ``...ForCausalLM``;
:data:`ARCHITECTURES`), the base model otherwise. A repo's own
code (``auto_map``: its ``modeling_*.py``) runs only with ``--trust-remote-code`` on the
command line: ``trust_remote_code`` is always passed, so transformers never asks on stdin. Class names
come from ``id2label``; preprocessing from the image processor's config, mapped onto
:class:`~inspect_model.loading.preprocess.Preprocess`. Outputs stay ModelOutput dataclasses:
the engine flattens them by field name and ``logits`` is the scored output
(:func:`inspect_model.methods.objectives.targets.select_output`). Text models (no image size in the
config, a ``vocab_size``) get seeded token ids below the vocabulary size as their input.
"""

from __future__ import annotations

import os
from typing import Any

from inspect_model.errors import ModelLoadError, UsageError
from inspect_model.loading.hub_models import hub_file, quiet_hub_logs, require, short_reason
from inspect_model.loading.loaded import LoadedModel, LoadRequest
from inspect_model.loading.preprocess import PRESETS, Preprocess

# PIL's resampling codes, as image processors store them (PIL.Image.Resampling).
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
TEXT_SEQ_LEN = 128  # token ids per sample for text models without --input-size

# The config's architectures suffix -> (the transformers Auto class, the task).
ARCHITECTURES = (
    ("ForImageClassification", "AutoModelForImageClassification", "classification"),
    ("ForObjectDetection", "AutoModelForObjectDetection", "detection"),
    ("ForSemanticSegmentation", "AutoModelForSemanticSegmentation", "segmentation"),
    ("ForInstanceSegmentation", "AutoModelForInstanceSegmentation", "segmentation"),
    ("ForUniversalSegmentation", "AutoModelForUniversalSegmentation", "segmentation"),
    ("ForImageSegmentation", "AutoModelForImageSegmentation", "segmentation"),
    ("ForVideoClassification", "AutoModelForVideoClassification", "video"),
    # Text models keep their heads (issue 26): a classifier's class names come from id2label;
    # a language model's "classes" are its vocabulary (named by its tokenizer under --text).
    ("ForSequenceClassification", "AutoModelForSequenceClassification", "classification"),
    ("ForCausalLM", "AutoModelForCausalLM", "custom"),
    ("LMHeadModel", "AutoModelForCausalLM", "custom"),
    ("ForMaskedLM", "AutoModelForMaskedLM", "custom"),
    # Encoder-decoders keep their language-model head (issue 42: seq2seq), where the Auto class knows the config.
    ("ForConditionalGeneration", "AutoModelForSeq2SeqLM", "custom"),
    ("ForTokenClassification", "AutoModelForTokenClassification", "classification"),
)


class HfSource:
    name = "hf"
    runs_code = False  # a repo's own code runs only with --trust-remote-code (command line only)

    def claims(self, spec: str) -> bool:
        return spec.startswith("hf:") or (os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "config.json")))

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        if request.model_args:
            raise UsageError("--model-arg applies to timm:NAME and user models, not to Hugging Face models")
        return load_hf(spec, weights=request.weights, device=request.device,
                       trust_remote_code=request.trust_remote_code, dtype=request.dtype, empty=request.empty)


SOURCE = HfSource()


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
    # The config is the architecture: --weights none needs it too (issue 39), so the way out
    # offline is a local save_pretrained folder, not --weights none.
    cfg = hub_file(ref, ["config.json"], what=f"the config of {name}",
                   alternatives="the config is the architecture, which --weights none needs too; fetch it once with network access (HF_HOME/HF_HUB_CACHE choose the cache; unset "
                   "HF_HUB_OFFLINE), or give a local folder written by save_pretrained instead of hf:ORG/NAME "
                   "(config.json; the weights may be missing with --weights none)")
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
        from inspect_model.loading.parsing import load_json

        from inspect_model.loading.sources.hf_values import shard_names

        index = load_json(path, what="weights index", error=ModelLoadError)
        for shard in shard_names(index, f"weights index '{path}'"):  # none outside the repo (issue 41)
            hub_file(repo, [shard], what=what)


def _has_weights(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("model.safetensors", "model.safetensors.index.json"))


def auto_class(transformers: Any, config: Any) -> tuple[Any, str]:
    """The Auto class and task of the config's architectures; the base model and "custom" else."""
    archs = [str(a) for a in getattr(config, "architectures", None) or []]
    for suffix, auto, task in ARCHITECTURES:
        if any(a.endswith(suffix) for a in archs) and hasattr(transformers, auto) and (
                suffix != "ForConditionalGeneration" or _knows(getattr(transformers, auto), config)):
            return getattr(transformers, auto), task
    return transformers.AutoModel, "custom"


_auto_class = auto_class  # the name earlier code imports


def _knows(auto: Any, config: Any) -> bool:
    """The Auto class has a model for this config (a vision-language ...ForConditionalGeneration
    is no seq2seq LM)."""
    mapping = getattr(auto, "_model_mapping", None)
    try:
        return mapping is None or type(config) in mapping
    except Exception:  # noqa: BLE001 - a lazy mapping that cannot say: try the class
        return True


def preprocess_from_processor(d: Any, where: str = "image processor config") -> tuple[Preprocess, list[str]]:
    """An image processor's config (preprocessor_config.json) as a :class:`Preprocess`.

    ``size`` is ``{"height", "width"}`` (resize both sides: squash), or ``{"shortest_edge"}``
    (shorter side; with ``crop_pct`` below 384 ConvNeXt-style resize to ``size / crop_pct``
    then crop ``size``), optionally followed by a centre crop of ``crop_size``. Every value is
    checked first (:class:`~.hf_values.Values`): a bad one is a model-load error naming
    ``where`` and the key (issue 41)."""
    from inspect_model.loading.sources.hf_values import Values

    v = Values(d, where)
    notes: list[str] = []
    normalize = v.flag("do_normalize", True)
    mean = v.numbers("image_mean") or PRESETS["imagenet"]["mean"] if normalize else (0.0, 0.0, 0.0)
    std = v.numbers("image_std", positive=True) or PRESETS["imagenet"]["std"] if normalize else (1.0, 1.0, 1.0)
    if len(mean) != len(std):
        raise v.bad("image_std", f"{len(mean)} numbers, as many as image_mean")
    interp = v.choice("resample", _RESAMPLE, 2)
    size = v.sizes("size") or {"shortest_edge": 224}
    crop_size = v.sizes("crop_size")
    if crop_size and "shortest_edge" in crop_size:
        crop_size = {"height": crop_size["shortest_edge"], "width": crop_size["shortest_edge"]}
    crop = crop_size.get("height") if v.flag("do_center_crop", False) and crop_size else None
    squash = False
    pct = v.number("crop_pct", 0.0, 10.0)
    if "shortest_edge" in size:
        side = size["shortest_edge"]
        if pct and crop is None and side < 384:
            resize, crop = max(1, int(side / pct)), side
        elif pct and crop is None:
            resize, crop, squash = side, side, True  # ConvNeXt's processor warps to side x side at 384+
        else:
            resize, crop = side, crop or side
    else:
        h, w = size.get("height", 224), size.get("width", 224)
        if h != w:
            notes.append(f"the image processor resizes to {h}x{w}; images are resized to {min(h, w)} squares")
        resize, crop, squash = min(h, w), crop or min(h, w), True
    if not v.flag("do_resize", True):
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


def load_hf(spec: str, *, weights: str | None = None, device: str = "cpu",
            trust_remote_code: bool = False, dtype: str | None = None, empty: bool = False) -> LoadedModel:
    """Build ``hf:ORG/NAME`` (or a ``save_pretrained`` directory) on ``device`` in ``dtype``
    directly (``empty``: parameters on the meta device, buffers real, no weight read). The
    repo's own code (``auto_map``) runs only with ``trust_remote_code``; transformers is never
    left to ask."""
    transformers = require("transformers")
    with quiet_hub_logs():
        return _load_hf(transformers, spec, weights=weights, device=device, trust_remote_code=trust_remote_code,
                        dtype=dtype, empty=empty)


def _load_hf(transformers: Any, spec: str, *, weights: str | None, device: str,
             trust_remote_code: bool, dtype: str | None = None, empty: bool = False) -> LoadedModel:
    w = (weights or "none").strip()
    if w.lower() not in ("none", "random", "", "default"):
        raise UsageError(f"--weights {w}: Hugging Face models take DEFAULT (the repo's weights) or none; "
                         "pin a revision as hf:ORG/NAME@REVISION")
    pretrained = w.lower() == "default"
    name, folder = _local_dir(spec, pretrained)
    from inspect_model.loading.sources.hf_values import check_model_config

    check_model_config(folder)  # the values this tool reads itself, typed, before transformers (issue 41)
    remote = _remote_code(folder)
    if remote and trust_remote_code and spec.startswith("hf:") and not os.path.isdir(spec.removeprefix("hf:")):
        for module in remote:  # the repo's code files, into the cache beside its config
            hub_file(spec.removeprefix("hf:"), [f"{module}.py"], what=f"the code of {name}")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(_config_error(name, remote, exc)) from exc
    from inspect_model.loading.sources.hf_values import check_local_shards

    auto, task = auto_class(transformers, config)
    if pretrained:
        check_local_shards(folder)  # no shard outside the folder the user named (issue 41)
    if pretrained and not _has_weights(folder):
        raise ModelLoadError(f"{name} has no model.safetensors (weights in pickle files are not read); run with "
                             "--weights none, or save it again with save_pretrained(safe_serialization=True)")
    model = _build(auto, config, folder, name, pretrained=pretrained, device=device,
                   trust_remote_code=trust_remote_code, dtype=dtype, empty=empty)
    model.eval()
    return _loaded(model, config, folder, name, task=task, pretrained=pretrained, device=device)


def _remote_code(folder: str) -> list[str]:
    """The Python modules the folder's config.json names in ``auto_map`` (its own code)."""
    from inspect_model.loading.parsing import load_json

    doc = load_json(os.path.join(folder, "config.json"), what="config file", error=ModelLoadError)
    auto_map = doc.get("auto_map") if isinstance(doc, dict) else None
    mods: list[str] = []
    for ref in (auto_map.values() if isinstance(auto_map, dict) else []):
        for one in (ref if isinstance(ref, list) else [ref]):
            if isinstance(one, str) and "." in one:
                mod = one.split("--")[-1].rsplit(".", 1)[0]
                if mod.isidentifier() and mod not in mods:
                    mods.append(mod)
    return mods


def _config_error(name: str, remote: list[str], exc: BaseException) -> str:
    if remote and "trust_remote_code" in str(exc):
        files = ", ".join(f"{m}.py" for m in remote[:3])
        return (f"{name} needs its own code ({files}) to build, and it is not run; pass --trust-remote-code "
                "on the command line only if you trust that code")
    return f"cannot read the config of {name}: {short_reason(exc)}"


def _build(auto: Any, config: Any, folder: str, name: str, *, pretrained: bool, device: str,
           trust_remote_code: bool, dtype: str | None = None, empty: bool = False) -> Any:
    import torch

    from inspect_model.loading.shapes import parse_dtype

    # The dtype goes to transformers, which builds in it: a bfloat16 model never exists in
    # float32 first (issue 37).
    want = {"dtype": parse_dtype(dtype)} if dtype else {}
    try:
        if empty:  # parameters on meta, buffers (rotary tables) real: the placement fills them
            from accelerate import init_empty_weights

            with init_empty_weights():
                return auto.from_config(config, trust_remote_code=trust_remote_code, **want)
        if pretrained and device != "meta":  # on meta no value is read
            model = auto.from_pretrained(folder, local_files_only=True, use_safetensors=True,
                                         trust_remote_code=trust_remote_code, **want)
            return model.to(device)
        with torch.device(device):
            return auto.from_config(config, trust_remote_code=trust_remote_code, **want)
    except Exception as exc:
        raise ModelLoadError(f"cannot build {name} ({type(config).__name__}, {auto.__name__}): "
                             f"{type(exc).__name__}: {short_reason(exc)}") from exc


def _loaded(model: Any, config: Any, folder: str, name: str, *, task: str, pretrained: bool,
            device: str) -> LoadedModel:
    """The record: preprocessing from the image processor's config, sizes, class names."""
    from inspect_model.loading.parsing import load_json

    notes: list[str] = []
    pre = None
    proc = os.path.join(folder, "preprocessor_config.json")
    if os.path.isfile(proc):
        doc = load_json(proc, what="image processor config", error=ModelLoadError)
        pre, pre_notes = preprocess_from_processor(doc, f"image processor config '{proc}'")
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
    if task != "custom" and id2label and len(id2label) == n:
        cats = [str(id2label.get(i, id2label.get(str(i), i))) for i in range(n)]
    if vocab:
        task = "text"
    family = "text" if vocab else "classification" if task == "classification" and cats else "custom"
    return LoadedModel(
        model=model, name=name, source="hf", family=family, task="classification" if task == "custom" else task,
        weights="DEFAULT" if pretrained else None, categories=cats, transforms=pre,
        input_sizes=[size] if size else None, device=device, notes=notes, token_vocab=vocab, config=config,
    )
