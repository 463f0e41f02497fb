"""The ``timm`` model source: ``timm:NAME`` models, built by ``timm.create_model``, fed as timm's data config says.

``--weights DEFAULT`` takes the tag in the name (``timm:convnext_tiny.fb_in22k``) or timm's
default tag; ``--weights TAG`` names one (``--weights fb_in22k``); ``none`` builds random
weights. The weight file comes from timm's own sources (the Hugging Face hub repo of the
pretrained config, else its URL into torch's hub cache) through
:mod:`inspect_model.loading.hub_models`, is read without unpickling, and is handed to timm
as a state dict so that timm's own key filters and head adaptation still apply.
Preprocessing is timm's ``resolve_model_data_config`` (input size, interpolation,
``crop_pct``, mean, std) mapped onto :class:`~inspect_model.loading.preprocess.Preprocess`;
class names come from the pretrained config or timm's ImageNet-1k/22k info; the CAM layer
from the model's own ``feature_info`` (:func:`declared_cam_layer`). ``--model-arg`` values go
to ``timm.create_model``, except those that make timm read files itself.
"""

from __future__ import annotations

import fnmatch
import math
import os
from typing import Any

from inspect_model.errors import ModelLoadError, UsageError, suggest
from inspect_model.loading.hub_models import (
    hub_file,
    missing_message,
    quiet_hub_logs,
    read_state_dict,
    require,
    short_reason,
)
from inspect_model.loading.loaded import LoadedModel, LoadRequest
from inspect_model.loading.preprocess import Preprocess

_DEFAULT_CROP_PCT = 0.875  # timm.data.DEFAULT_CROP_PCT
# create_model arguments that make timm read a file or a hub repo with its own loader (which
# unpickles, weights_only=False): weights come only through --weights and --checkpoint.
_FILE_ARGS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir",
              "pretrained_strict")


class TimmSource:
    name = "timm"
    runs_code = False

    def claims(self, spec: str) -> bool:
        return spec.startswith("timm:")

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        return load_timm(spec.split(":", 1)[1], weights=request.weights, device=request.device, empty=request.empty,
                         model_args=request.model_args)


SOURCE = TimmSource()


def declared_cam_layer(model: Any) -> str | None:
    """The layer a timm model declares last in ``feature_info`` (its deepest feature map: a
    CNN's last stage, Swin's last stage), or None for a model that declares none.

    A vision transformer that pools its class token (``global_pool == 'token'``) declares
    ``blocks.N``, whose patch tokens never reach the logits; its CAM layer is that block's
    first norm, whose patch tokens reach the class token through attention."""
    info = getattr(model, "feature_info", None)
    if not isinstance(info, (list, tuple)) or not info:
        return None
    last = info[-1]
    name = last.get("module") if isinstance(last, dict) else None
    if not isinstance(name, str) or not name:
        return None
    modules = dict(model.named_modules())
    if name not in modules:
        return None
    if getattr(model, "num_prefix_tokens", 0) and getattr(model, "global_pool", None) == "token" \
            and f"{name}.norm1" in modules:
        return f"{name}.norm1"
    return name


def list_timm(pattern: str | None = None) -> list[tuple[str, str]]:
    """``(name, family)`` of timm's architectures (``NAME.TAG`` weights when the pattern has
    a dot), filtered by a glob or a substring."""
    timm = require("timm")
    tagged = bool(pattern and "." in pattern)
    names = timm.list_pretrained() if tagged else timm.list_models()
    if pattern:
        if any(c in pattern for c in "*?["):
            names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        else:
            names = [n for n in names if pattern.lower() in n.lower()]
    return [(n, "timm") for n in names]


def resolve_name(timm: Any, name: str, weights: str | None) -> tuple[str, str | None]:
    """``(architecture, tag or None)`` for ``name`` and ``--weights`` (None: random)."""
    arch, _, tag = name.partition(".")
    archs = timm.list_models()
    if arch not in archs:
        raise ModelLoadError(f"unknown timm model '{arch}'" + (suggest(arch, archs) or "")
                             + "; `inspect-model models --source timm PATTERN` lists them")
    tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
    w = (weights or "none").strip()
    if w.lower() in ("none", "random", ""):
        return arch, None
    if w.upper() != "DEFAULT":
        tag = w
    if not tags:
        raise ModelLoadError(f"timm model '{arch}' has no pretrained weights; use --weights none or --checkpoint FILE")
    if tag and tag not in tags:
        raise UsageError(f"weights '{tag}' are not available for timm:{arch}" + (suggest(tag, tags) or "")
                         + f"; choose one of: DEFAULT, none, {', '.join(tags)}")
    if not tag:
        cfg = timm.models.get_pretrained_cfg(arch)
        tag = getattr(cfg, "tag", None) or tags[0]
    return arch, tag


def weights_file(cfg: Any, full: str) -> str:
    """The local path of the weights of pretrained config ``cfg`` (cached or downloaded)."""
    what = f"the weights of timm:{full}"
    if cfg.hf_hub_id:
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
        path = hub_file(cfg.hf_hub_id, names, what=what)
        assert path is not None
        return path
    if cfg.url:
        return _url_file(cfg.url, what)
    raise ModelLoadError(f"timm:{full} names no weights file (no hub repo, no URL); use --weights none")


def _url_file(url: str, what: str) -> str:
    """timm's legacy URL weights, in torch's hub cache (TORCH_HOME), as timm keeps them."""
    import socket
    from urllib.parse import urlparse

    import torch

    from inspect_model.loading.hub_models import offline

    path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(url).path))
    if os.path.exists(path):
        return path
    old = socket.getdefaulttimeout()
    try:
        switch = offline()
        if switch:
            raise OSError(f"{switch} is set")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        socket.setdefaulttimeout(30)  # no network must fail fast rather than hang
        torch.hub.download_url_to_file(url, path, progress=False)
    except Exception as exc:
        raise ModelLoadError(missing_message(what, os.path.dirname(path), short_reason(exc))) from exc
    finally:
        socket.setdefaulttimeout(old)
    return path


def preprocess_from_timm(model: Any) -> tuple[Preprocess, tuple[int, ...], list[str]]:
    """timm's eval transform for ``model`` as a :class:`Preprocess`, the input size, and
    notes where the mapping is approximate. timm's ``create_transform`` (eval) resizes the
    shorter side to ``floor(size / crop_pct)`` and centre-crops ``size``."""
    timm = require("timm")
    cfg = timm.data.resolve_model_data_config(model)
    size = tuple(int(d) for d in cfg["input_size"])  # (C, H, W)
    crop_pct = float(cfg.get("crop_pct") or _DEFAULT_CROP_PCT)
    mode = cfg.get("crop_mode") or "center"
    notes: list[str] = []
    h, w = size[-2], size[-1]
    if h != w:
        notes.append(f"timm's input size is {h}x{w}; images are resized and cropped to {min(h, w)} squares")
    side = min(h, w)
    if mode not in ("center", "squash"):
        notes.append(f"timm's crop mode '{mode}' is approximated by a centre crop")
    pre = Preprocess(
        resize=math.floor(side / crop_pct), crop=side,
        mean=tuple(float(m) for m in cfg["mean"]), std=tuple(float(s) for s in cfg["std"]),
        interpolation=str(cfg.get("interpolation") or "bilinear"), source="timm data config",
        squash=mode == "squash",
    )
    return pre, size, notes


def class_names(model: Any) -> list[str] | None:
    """Class names of the head: the pretrained config's own, else ImageNet-1k/22k's
    (the first synonym of each WordNet description: 'tench, Tinca tinca' -> 'tench')."""
    timm = require("timm")
    cfg = getattr(model, "pretrained_cfg", None) or {}
    n = getattr(model, "num_classes", None)
    names = cfg.get("label_descriptions") or cfg.get("label_names")
    if names and (not n or len(names) == n):
        return [str(x).split(",")[0].strip() for x in names]
    try:
        subset = timm.data.infer_imagenet_subset(model)
    except Exception:  # noqa: BLE001 - an unusual head: no names, never an error
        subset = None
    if not subset:
        return None
    info = timm.data.ImageNetInfo(subset)
    if n and info.num_classes() != n:
        return None
    return [d.split(",")[0].strip() for d in info.label_descriptions()]


def load_timm(name: str, *, weights: str | None = None, device: str = "cpu",
              model_args: dict[str, Any] | None = None, empty: bool = False) -> LoadedModel:
    """Build ``timm:NAME`` on ``device`` (``meta`` builds without memory); ``model_args``
    go to ``timm.create_model`` (``--model-arg num_classes=10``). ``empty`` (inside
    accelerate's ``init_empty_weights``): the weights file is found, not read."""
    bad = [k for k in (model_args or {}) if k in _FILE_ARGS]
    if bad:
        raise UsageError(f"--model-arg {bad[0]} is not passed to timm (it makes timm read weights with its "
                         "own unpickling loader); use --weights TAG or --checkpoint FILE")
    timm = require("timm")
    with quiet_hub_logs():
        return _load_timm(timm, name, weights=weights, device=device, model_args=model_args, read=not empty)


def _load_timm(timm: Any, name: str, *, weights: str | None, device: str,
               model_args: dict[str, Any] | None, read: bool = True) -> LoadedModel:
    import torch

    arch, tag = resolve_name(timm, name, weights)
    # Without weights, a tagged name still chooses that tag's head (fb_in22k: 21841 classes).
    full = f"{arch}.{tag}" if tag else name
    notes: list[str] = []
    kwargs: dict[str, Any] = {}
    if tag:
        cfg = timm.models.get_pretrained_cfg(full)
        path = weights_file(cfg, full)
        if device != "meta" and read:  # on meta (or empty) no value is read: the file only has to be there
            kwargs = {"pretrained": True, "pretrained_cfg_overlay": {"state_dict": read_state_dict(path)}}
    kwargs.update(model_args or {})
    try:
        with torch.device(device):
            model = timm.create_model(full, **kwargs)
    except (ModelLoadError, UsageError):
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot build timm:{full}: {type(exc).__name__}: {short_reason(exc)}") from exc
    cfg_dict = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg_dict, dict):
        cfg_dict.pop("state_dict", None)  # do not keep a second copy of the weights alive
    model.eval()
    pre, size, pre_notes = preprocess_from_timm(model)
    notes.extend(pre_notes)
    return LoadedModel(
        model=model, name=f"timm:{full}", source="timm", family="classification", task="classification",
        weights=tag, categories=class_names(model) if tag else None, transforms=pre,
        input_sizes=[size], device=device, notes=notes, cam_layer=declared_cam_layer(model),
    )
