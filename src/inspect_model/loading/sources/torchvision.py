"""The ``torchvision`` model source: torchvision's registry by name, with weights through its own enums.

``resnet18`` or ``torchvision:resnet18``. The model's family is the torchvision sub-registry
it is listed in (``torchvision.models.detection`` ...), and its task follows from it; class
names and preprocessing come from the weights enum member. Cached weights are read without
unpickling (:mod:`inspect_model.loading.hub_weights`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from inspect_model.errors import ModelLoadError, UsageError, suggest
from inspect_model.loading.loaded import TORCHVISION_TASKS, LoadedModel, LoadRequest

FAMILIES = ("classification", "detection", "segmentation", "video", "optical_flow", "quantization")
_PATH_SUFFIXES = (".py", ".pt", ".pth", ".pt2", ".ts", ".jit", ".torchscript", ".ep", ".bin")


class TorchvisionSource:
    """``NAME`` or ``torchvision:NAME``: anything that does not look like a path or a
    ``module:attr`` (the last source tried)."""

    name = "torchvision"
    runs_code = False

    def claims(self, spec: str) -> bool:
        if spec.startswith("torchvision:"):
            return True
        return ":" not in spec and not spec.endswith(_PATH_SUFFIXES) and os.sep not in spec and "/" not in spec

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        name = spec.removeprefix("torchvision:")
        # --model-arg: the builder's keywords (num_classes=10 for a fine-tuned checkpoint;
        # quantize=True|False for quantized_*); torchvision checks them against the weights.
        if "quantize" in (request.model_args or {}) and registry().get(name) != "quantization":
            raise UsageError(f"--model-arg quantize=True|False to torchvision's quantized_* models only; '{name}' "
                             "is not one (see `inspect-model models quantized_*`)")
        return load_torchvision(name, weights=request.weights, device=request.device,
                                build_args=request.model_args or None, empty=request.empty)


SOURCE = TorchvisionSource()


def _tv():
    try:
        import torchvision
        from torchvision import models
    except ImportError as exc:  # pragma: no cover - torchvision is a dependency
        raise ModelLoadError(f"torchvision cannot be imported: {exc}") from exc
    return torchvision, models


def registry() -> dict[str, str]:
    """Every torchvision model name mapped to its family."""
    _, models = _tv()
    fam: dict[str, str] = {}
    for family, mod in (
        ("detection", models.detection),
        ("segmentation", models.segmentation),
        ("video", models.video),
        ("optical_flow", models.optical_flow),
        ("quantization", models.quantization),
    ):
        for n in models.list_models(module=mod):
            fam[n] = family
    for n in models.list_models(module=models):
        fam.setdefault(n, "classification")
    return dict(sorted(fam.items()))


def list_models(pattern: str | None = None) -> list[tuple[str, str]]:
    """``(name, family)`` pairs of the registry, filtered by a glob or substring."""
    import fnmatch

    items = list(registry().items())
    if not pattern:
        return items
    if any(c in pattern for c in "*?["):
        return [(n, f) for n, f in items if fnmatch.fnmatchcase(n, pattern)]
    return [(n, f) for n, f in items if pattern.lower() in n.lower()]


def resolve_weights(name: str, weights: str | None) -> Any:
    """The weights enum member for ``--weights`` (None for ``none``)."""
    if weights is None or weights.lower() in ("none", "random", ""):
        return None
    _, models = _tv()
    try:
        enum = models.get_model_weights(name)
    except Exception as exc:  # models with no published weights
        raise ModelLoadError(
            f"model '{name}' has no torchvision weights; use --weights none or --checkpoint FILE"
        ) from exc
    members = [m for m in enum.__members__ if m != "DEFAULT"]  # DEFAULT is an alias of one of them
    wanted = weights.split(".")[-1]
    if wanted.upper() == "DEFAULT":
        return enum.DEFAULT
    if wanted not in members:
        by_lower = {m.lower(): m for m in members}
        if wanted.lower() in by_lower:
            return enum[by_lower[wanted.lower()]]
        choices = ["DEFAULT", "none", *members]
        close = suggest(wanted.lower(), [c.lower() for c in choices])
        for c in choices:  # the suggestion in the spelling the option takes
            close = close.replace(repr(c.lower()), repr(c))
        raise UsageError(
            f"weights '{weights}' are not available for {name}" + close + f"; choose one of: {', '.join(choices)}"
        )
    return enum[wanted]


def weights_cache_path(w: Any) -> str:
    """Where torch's hub cache keeps (or would keep) the file of weights enum member ``w``."""
    from urllib.parse import urlparse

    import torch

    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(w.url).path))


class WeightsNotCached(ModelLoadError):
    """The weights' file is not in torch's hub cache and could not be downloaded."""

    def __init__(self, message: str, *, weights: str, path: str) -> None:
        super().__init__(message)
        self.weights, self.path = weights, path


def ensure_weights_file(w: Any, name: str) -> str:
    """Make sure the file of weights ``w`` is in torch's hub cache (downloading it if the
    network allows) and return its path; a one-line error says where it would be cached."""
    import torch

    path = weights_cache_path(w)
    if os.path.exists(path):
        return path
    import socket

    old_timeout = socket.getdefaulttimeout()
    try:
        from inspect_model.settings import env_flag

        if env_flag("INSPECT_MODEL_OFFLINE"):  # "off" is not offline (issue 41)
            raise OSError("INSPECT_MODEL_OFFLINE is set")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # No network must fail fast rather than hang: a timeout per socket operation.
        socket.setdefaulttimeout(30)
        torch.hub.download_url_to_file(w.url, path, progress=False)
    except Exception as exc:
        raise WeightsNotCached(
            f"weights {type(w).__name__}.{w.name} for {name} are not cached at {path} and "
            f"could not be downloaded from {w.url} ({_short_reason(exc)}); "
            "run with --weights none (random weights), put the file there, or pass --checkpoint FILE",
            weights=f"{type(w).__name__}.{w.name}", path=path,
        ) from exc
    finally:
        socket.setdefaulttimeout(old_timeout)
    return path


def _short_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    text = str(reason).strip().splitlines()[0] if str(reason).strip() else type(exc).__name__
    return text[:120]


def default_input_sizes(name: str, family: str, model: Any = None, w: Any = None) -> list[tuple[int, ...]]:
    """A sensible per-sample input shape for a torchvision model, from the model itself
    (ViT's ``image_size``), its weights' preprocessing, or its family."""
    _, models = _tv()
    image_size = getattr(model, "image_size", None)
    crop: int | None = None
    if isinstance(image_size, int):
        crop = image_size
    else:
        ref = w
        if ref is None:
            try:
                ref = models.get_model_weights(name).DEFAULT
            except Exception:
                ref = None
        if ref is not None:
            try:
                t = ref.transforms()
                cs = getattr(t, "crop_size", None)
                if cs:
                    crop = int(cs[0])
            except Exception:
                crop = None
    if family == "video":
        frames = 16
        return [(3, frames, crop or 112, crop or 112)]
    if family == "optical_flow":
        return [(3, 224, 224), (3, 224, 224)]
    if family in ("detection", "segmentation"):
        return [(3, crop or 520, crop or 520)]
    return [(3, crop or 224, crop or 224)]


def _build_kwargs(name: str, family: str) -> dict[str, Any]:
    # Quantized builders default to an unquantized float model; keep that for inspection.
    if family == "quantization":
        return {"quantize": False}
    if family in ("detection", "segmentation"):
        # Their builders download ImageNet backbone weights by default even for
        # weights=None; an architecture-only model must not touch the network.
        return {"weights_backbone": None}
    return {}


class params_on_meta:
    """Within this context, every parameter registered on a module goes to the meta device
    (allocated for an instant, never initialised for real). Buffers stay real."""

    def __enter__(self) -> params_on_meta:
        from torch import nn

        self._orig = nn.Module.register_parameter
        orig = self._orig

        def register_parameter(module: Any, name: str, param: Any) -> None:
            orig(module, name, param)
            if param is not None and param.device.type != "meta":
                p = module._parameters[name]
                module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from torch import nn

        nn.Module.register_parameter = self._orig  # type: ignore[method-assign]


def load_torchvision(
    name: str,
    *,
    weights: str | None = None,
    device: str = "cpu",
    categories_from: Any = None,
    build_args: dict[str, Any] | None = None,
    empty: bool = False,
) -> LoadedModel:
    """Build torchvision model ``name`` on ``device`` (``meta`` builds without memory).
    ``empty``: inside accelerate's ``init_empty_weights`` (parameters on meta), the weights
    file is memory-mapped and only its buffers are read (:mod:`inspect_model.loading.blockwise`)."""
    import torch

    _, models = _tv()
    reg = registry()
    if name not in reg:
        raise ModelLoadError(
            f"unknown model '{name}'"
            + (suggest(name, list(reg)) or "")
            + "; `inspect-model models` lists torchvision's models, or give FILE.py:FACTORY"
        )
    family = reg[name]
    w = resolve_weights(name, weights)
    kwargs = _build_kwargs(name, family)
    if w is not None and family == "quantization":
        kwargs["quantize"] = True  # quantized weights only load into a quantized model
    kwargs.update(build_args or {})  # quantize=True: torchvision calibrates on random input and converts
    if kwargs.get("quantize") and device == "meta":
        device = "cpu"  # quantizing calibrates on real numbers; a quantized model has no meta form
    try:
        if w is not None:
            path = ensure_weights_file(w, name)
            from inspect_model.loading.hub_weights import verified_weights

            try:
                with torch.device(device), verified_weights(path, mmap=empty), _meta_copies_quiet():
                    model = models.get_model(name, weights=w, **kwargs)
            except ModelLoadError:
                raise
            except (RuntimeError, EOFError, OSError, ValueError) as exc:
                raise ModelLoadError(
                    f"weights file {path} for {name} is unreadable or does not match the model "
                    f"({type(exc).__name__}: {_short_reason(exc)}); delete it to download again, "
                    "or run with --weights none"
                ) from exc
        else:
            try:
                with torch.device(device):
                    model = models.get_model(name, weights=None, **kwargs)
            except NotImplementedError:
                if device != "meta":
                    raise
                # Some builders compute their config with tensor values (RegNet): build with
                # real config tensors but put each parameter on meta as it is registered.
                with params_on_meta():
                    model = models.get_model(name, weights=None, **kwargs)
                model = model.to("meta")  # buffers too: the meta pass needs shapes only
    except (ModelLoadError, UsageError):
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot build torchvision model '{name}': {type(exc).__name__}: {exc}") from exc
    model.eval()
    cats, transforms = _weights_meta(models, name, w, build_args)
    return LoadedModel(
        model=model,
        name=name,
        source="torchvision",
        family=family,
        task=TORCHVISION_TASKS.get(family, "classification"),
        weights=None if w is None else w.name,
        categories=cats,
        transforms=transforms,
        input_sizes=default_input_sizes(name, family, model, w),
        device=device,
    )



@contextlib.contextmanager
def _meta_copies_quiet() -> Iterator[None]:
    """An empty build's ``load_state_dict`` into meta parameters is a no-op, as meant: torch
    warns about each one."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
        yield


def _weights_meta(models: Any, name: str, w: Any, build_args: dict[str, Any] | None) -> tuple[Any, Any]:
    """(class names, preprocessing transforms) of the weights; with ``--weights none`` the
    default weights' class names where the head keeps its size."""
    if w is None:
        return (None if (build_args or {}).get("num_classes") else _offline_categories(models, name)), None
    try:
        transforms = w.transforms()
    except Exception:
        transforms = None
    return list(w.meta.get("categories") or []) or None, transforms


def _offline_categories(models: Any, name: str) -> list[str] | None:
    """The class names of ``name``'s default weights, which ship in torchvision's weights enum
    (no download): ``--weights none`` keeps the head's size, so its indices mean the same
    classes (issue 39: `713 photocopier`, `--target tabby`)."""
    try:
        meta = models.get_model_weights(name).DEFAULT.meta
    except Exception:  # a builder without registered weights
        return None
    return list(meta.get("categories") or []) or None
