"""What a model source hands the rest of the tool: :class:`LoadedModel`.

Every source (:mod:`inspect_model.loading.sources`) returns one: the module plus what is
known about feeding and reading it -- its task, class names, preprocessing, input sizes, the
layer a class activation map is best taken at, the hub config. :func:`from_module` fills the
record for a module whose source knows nothing beyond the module itself (user code, saved
files); it reads what the module declares (``input_size``, ``image_size``, ``categories``)
and infers the task from where its class comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from inspect_model.devices import model_device
from inspect_model.errors import ModelLoadError

if TYPE_CHECKING:
    from torch import nn

# What a model computes; other parts dispatch on it (detection objectives, video inputs).
TASKS = ("classification", "detection", "segmentation", "video", "optical_flow", "quantized", "text")

# torchvision's sub-registries (torchvision.models.<module>) and the task of their models.
TORCHVISION_TASKS = {"detection": "detection", "segmentation": "segmentation", "video": "video",
                     "optical_flow": "optical_flow", "quantization": "quantized"}


@dataclass
class LoadedModel:
    """A model ready to inspect, plus what is known about how to feed it."""

    model: nn.Module
    name: str
    source: str  # the source's name: "torchvision", "timm", "hf", "python", "torchscript", "export", ...
    family: str = "custom"  # torchvision's sub-registry ("classification", "detection", ...), or "custom"
    task: str = "classification"  # one of TASKS
    weights: str | None = None  # weights enum member name / tag, or None
    categories: list[str] | None = None
    transforms: Any = None  # the source's own preprocessing (torchvision's transforms or a Preprocess)
    input_sizes: list[tuple[int, ...]] | None = None  # per-sample input shapes (no batch)
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    hookable: bool = True  # False where torch rejects module hooks (TorchScript)
    static_batch: int | None = None  # batch size fixed at export (torch.export), if any
    checkpoint: Any = None  # checkpoints.CheckpointReport when --checkpoint was loaded
    token_vocab: int | None = None  # text models: inputs are token ids below this (HF vocab_size)
    borrowed: bool = False  # the model is the user's own instance (package.module:ATTR): copy before changing it
    cam_layer: str | None = None  # the layer the source declares for class activation maps (timm feature_info)
    config: Any = None  # the hub's model config (Hugging Face), if any


@dataclass(frozen=True)
class LoadRequest:
    """What a source needs besides the spec."""

    weights: str | None = None  # "DEFAULT", "none", an enum member or a tag
    device: str = "cpu"
    model_args: dict[str, Any] = field(default_factory=dict)
    trust_checkpoint: bool = False  # saved files may unpickle (command line only)
    trust_remote_code: bool = False  # Hugging Face repos may run their modeling_*.py (command line only)
    dtype: str | None = None  # build in this dtype directly (--dtype), not float32 first (issue 37)
    empty: bool = False  # parameters on the meta device, buffers real (accelerate's init_empty_weights)
    # The preflight of a user's class (issue 37): called with the class built on the meta device and
    # its name before the real build. Factories and instances are not built twice (they may cache,
    # train or load).
    check: Any = None


@runtime_checkable
class ModelSource(Protocol):
    """One way of naming and loading models."""

    name: str
    runs_code: bool  # loading runs code from the spec (a .py file, a module, a TorchScript program)

    def claims(self, spec: str) -> bool:
        """Whether this source loads ``spec``; cheap, imports no torch."""
        ...

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        """Load ``spec``; every failure a one-line :class:`~inspect_model.errors.InspectModelError`."""
        ...


def require_hookable(loaded: LoadedModel, command: str) -> None:
    """Refuse, in one clear line, to run a layer-hooking ``command`` on a model that cannot
    take module hooks (TorchScript). Every engine-using command calls this after loading."""
    if loaded.hookable:
        return
    raise ModelLoadError(hooks_unsupported_message(loaded.name, command, loaded.source))


def hooks_unsupported_message(name: str, command: str | None, source: str = "torchscript") -> str:
    what = "a TorchScript model" if source == "torchscript" else f"a {source} model"
    cmd = f"`{command}` needs" if command else "this needs"
    return (
        f"{name} is {what}, and torch does not allow module hooks on it; {cmd} them. "
        "Save the model with torch.export (.pt2), or give its Python class (FILE.py:NAME) "
        "with --checkpoint; `inspect-model check` runs on it as it is (all but the dead-layers check)"
    )


def brief(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line (errors.one_line)."""
    from inspect_model.errors import one_line

    text = one_line(exc)
    return type(exc).__name__ if text == type(exc).__name__ else f"{type(exc).__name__}: {text}"


def infer_task(model: Any) -> str:
    """The task of a module built elsewhere (user code, saved files): torchvision's detection,
    segmentation, video, optical-flow and quantization classes say it by their module
    (``torchvision.models.detection.faster_rcnn``); anything else is classification."""
    for cls in type(model).__mro__:
        parts = str(getattr(cls, "__module__", "")).split(".")
        if parts[:2] == ["torchvision", "models"] and len(parts) > 2 and parts[2] in TORCHVISION_TASKS:
            return TORCHVISION_TASKS[parts[2]]
    return "classification"


def from_module(model: nn.Module, *, name: str, source: str, device: str, notes: list[str] | None = None) -> LoadedModel:
    """A :class:`LoadedModel` for a module that brings nothing but itself: moved to ``device``
    (``meta``: left where it is), its declared or guessed input size, its ``categories``.
    A wrapped module (``torch.compile``, ``DataParallel``) is taken out of its wrapper first
    (:mod:`inspect_model.loading.wrappers`), so that its task is read from its own class."""
    from inspect_model.loading.wrappers import unwrap_module

    from inspect_model.loading.limits import check_module_depth

    model, unwrapped = unwrap_module(model)
    check_module_depth(model, name)  # before torch's recursive walks (issue 41)
    notes = [*(notes or []), *unwrapped]
    current = model_device(model)
    if device != "meta" and current is not None and current != device:
        try:
            model.to(device)
        except Exception as exc:
            raise ModelLoadError(f"cannot move model {name} to {device}: {brief(exc)}") from exc
    actual = model_device(model) or ("cpu" if device == "meta" else device)
    # The input size is only a default for runs without images or --input-size; the
    # report records the size used, so a guess needs no note of its own.
    sizes = declared_input_sizes(model) or guess_input_sizes(model)
    cats = getattr(model, "categories", None)
    categories = [str(c) for c in cats] if isinstance(cats, (list, tuple)) and cats else None
    return LoadedModel(model=model, name=name, source=source, family="custom", task=infer_task(model),
                       categories=categories, input_sizes=sizes, device=actual, notes=list(notes or []))


def declared_input_sizes(model: nn.Module) -> list[tuple[int, ...]] | None:
    """A model's own ``input_size`` attribute: ``(3, 32, 32)`` or a list of such tuples."""
    image_size = getattr(model, "image_size", None)  # torchvision's VisionTransformer has one
    if isinstance(image_size, int) and not isinstance(image_size, bool) and image_size > 0:
        guess = guess_input_sizes(model)
        channels = guess[0][0] if guess and len(guess[0]) == 3 else 3
        return [(channels, image_size, image_size)]
    size = getattr(model, "input_size", None)
    if isinstance(size, (tuple, list)) and size:
        if all(isinstance(d, int) for d in size):
            return [tuple(int(d) for d in size)]
        if all(isinstance(s, (tuple, list)) and all(isinstance(d, int) for d in s) for s in size):
            return [tuple(int(d) for d in s) for s in size]
    return None


def guess_input_sizes(model: nn.Module) -> list[tuple[int, ...]] | None:
    """From the first conv/linear layer: (C, 224, 224) for Conv2d, (F,) for Linear."""
    from torch import nn

    for mod in model.modules():
        kind = getattr(mod, "original_name", None)  # TorchScript keeps the class name here
        weight = getattr(mod, "weight", None)
        if kind in ("Conv1d", "Conv2d", "Conv3d", "Linear") and weight is not None and weight.dim() >= 2:
            c = int(weight.shape[1])
            return {"Conv1d": [(c, 224)], "Conv2d": [(c, 224, 224)], "Conv3d": [(c, 16, 112, 112)],
                    "Linear": [(c,)]}[kind]
        if isinstance(mod, nn.Conv2d):
            return [(int(mod.in_channels), 224, 224)]
        if isinstance(mod, nn.Conv1d):
            return [(int(mod.in_channels), 224)]
        if isinstance(mod, nn.Conv3d):
            return [(int(mod.in_channels), 16, 112, 112)]
        if isinstance(mod, nn.Linear):
            return [(int(mod.in_features),)]
        if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
            return None
    return None


def note_ignored_weights(loaded: LoadedModel, spec: str, weights: str | None) -> LoadedModel:
    """A model without named weights (user code, saved files) ignores ``--weights``: say so."""
    if weights and weights.lower() not in ("none", "random", "default"):
        loaded.notes.append(f"--weights {weights} ignored: {spec} is not a torchvision model; use --checkpoint FILE")
    return loaded
