"""What a request says, before anything is loaded: the model and input options every
command shares, parsed and checked without importing torch where possible.

``ModelOptions`` and ``InputOptions`` are the request half of every API function; the CLI
fills them from its options and the Python user from keyword arguments. Each is validated
once, where it is made (``__post_init__``: :func:`check_dtype`, :func:`check_request`), for
what needs no model (sizes, numbers, paths), so that a wrong argument fails in well under a
second; ``load`` turns ``ModelOptions`` into a loaded model.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inspect_model.errors import InputError, UsageError

DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass
class ModelOptions:
    """What every command needs to load a model. ``model`` is a spec (``resnet18``,
    ``file.py:build``, a TorchScript or ``.pt2`` file), an ``nn.Module`` or a ``LoadedModel``."""

    model: Any
    weights: str | None = "DEFAULT"
    checkpoint: Path | str | None = None
    model_args: list[str] | dict[str, Any] | None = None
    non_strict: bool = False
    trust_checkpoint: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    trust_remote_code: bool = False  # a Hugging Face repo may run its own code (command line only)
    device_map: str | None = None  # auto, balanced, sequential or a JSON file (issue 37; needs accelerate)
    max_memory: str | None = None  # "0=20GiB,cpu=30GiB"
    offload: bool = False  # stream what the GPUs do not hold from disk
    offload_dir: str | None = None  # where (implies offload); default: a temporary folder

    def __post_init__(self) -> None:
        self.dtype = check_dtype(self.dtype)  # validated once, here (issue 35), and normalised

    def placement(self) -> Any:
        """The placement asked for (:class:`~inspect_model.loading.placement.Placement`)."""
        from inspect_model.loading.placement import Placement

        return Placement(self.device_map, self.max_memory, bool(self.offload),
                         str(self.offload_dir) if self.offload_dir else None)

    def spec(self) -> str:
        """The model as the report names it."""
        return self.model if isinstance(self.model, str) else type(self.model).__name__


@dataclass
class InputOptions:
    """The inputs of an image command: image paths (or ``-`` for stdin), or a tensor (the
    API), or nothing (a seeded random input of ``input_size``)."""

    images: Any = None  # list of paths, a tensor (N, C, H, W), or None
    input_size: list[str] | None = None
    batch_size: int | None = None  # None: 8 images per batch, or 1 random input
    seed: int = 0
    preset: str | None = None
    resize: int | None = None
    crop: int | None = None
    mean: str | list[float] | None = None
    std: str | list[float] | None = None
    labels: Path | str | None = None
    skip_bad: bool = False
    names: list[str] | None = field(default=None)  # names of tensor inputs (API)
    image_input: str | None = None  # which model input the images feed (a name or position)
    inputs_file: Path | str | None = None  # the other inputs: a tensor, tuple or dict (torch.save)
    clip: bool = False  # a folder of frames is one video (video and flow models)
    frames: int | None = None  # frames per clip (None: the model's default)
    stride: int = 1  # frames between two frames of a clip
    clips: int = 1  # clips per video
    text: list[str] | None = None  # texts to tokenise (Hugging Face text models; loading/text.py)
    text_file: Path | str | None = None  # one text per line
    tokenizer: Path | str | None = None  # the tokenizer's folder (default: the model's own)
    task: str | None = None  # --task: the model's task by name (default: found from the model; issue 42)
    target_text: str | None = None  # --target-text: a continuation to explain (causal LM, seq2seq)
    position: int | None = None  # --position: the token whose prediction is explained
    contrast: str | None = None  # --contrast: a causal LM's logit difference against this token

    def __post_init__(self) -> None:
        check_request(self)  # validated once, here (issue 35): what needs no model and no torch


def parse_model_args(items: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """``['depth=3', 'name="x"']`` to a dict; values are Python literals, else strings."""
    if isinstance(items, dict):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--model-arg '{item}' is not key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key.isidentifier():
            raise UsageError(f"--model-arg key '{key}' is not a valid Python identifier")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def parse_floats(value: str | list[float] | None, option: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return [float(v) for v in value]
    try:
        out = [float(v) for v in value.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise UsageError(f"{option} '{value}' is not a comma-separated list of numbers") from exc
    if not out:
        raise UsageError(f"{option} '{value}' is not a comma-separated list of numbers")
    return out


def check_dtype(name: str) -> str:
    key = (name or "float32").strip().lower().replace("torch.", "")
    key = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
           "fp64": "float64", "double": "float64"}.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"--dtype '{name}' is not one of {', '.join(DTYPES)}")
    return key


def check_request(inputs: InputOptions | None, *, batch_size: int | None = None) -> None:
    """Checks that need no model and no torch: they fail at once (issue 13, item 11)."""
    from inspect_model.loading.shapes import parse_size

    bs = batch_size if batch_size is not None else (inputs.batch_size if inputs else None)
    if bs is not None and bs < 1:
        raise UsageError(f"--batch-size must be 1 or more, got {bs}")
    from inspect_model.loading.limits import check_option

    check_option("--batch-size", bs)  # the same ranges as config files and request options (issue 41)
    if inputs is None:
        return
    from inspect_model.loading.text import check_text_request

    check_text_request(inputs)  # --text, --text-file, --tokenizer (issue 26)
    sizes = [parse_size(s) for s in inputs.input_size or []]
    if inputs.images is None or (isinstance(inputs.images, (list, tuple)) and not inputs.images):
        check_memory(sizes, bs or 1)  # a random input: its size is known now
    from inspect_model.loading.video import ClipOptions

    ClipOptions(inputs.frames, inputs.stride, inputs.clips)  # checks the numbers
    for opt, v in (("--resize", inputs.resize), ("--crop", inputs.crop)):
        if v is not None and v < 1:
            raise UsageError(f"{opt} must be 1 or more, got {v}")
    for opt, v in (("--seed", inputs.seed), ("--resize", inputs.resize), ("--crop", inputs.crop)):
        check_option(opt, v)
    for opt, v in (("--mean", inputs.mean), ("--std", inputs.std)):
        vals = parse_floats(v, opt)
        if opt == "--std" and vals and any(x <= 0 for x in vals):
            raise UsageError(f"--std '{v}' must be positive")
    if inputs.labels is not None and not Path(inputs.labels).exists():
        raise InputError(f"labels file '{inputs.labels}' does not exist")
    if isinstance(inputs.images, (list, tuple)):
        for item in inputs.images:
            if not isinstance(item, (str, Path)) or str(item) == "-":
                continue
            text = str(item)
            if any(ch in text for ch in "*?[") or Path(text).exists() or inputs.skip_bad:
                continue
            raise InputError(f"image '{text}' does not exist")


def check_target_syntax(target: str | tuple[str, ...] | None) -> None:
    """The syntax of ``--target`` (``top:K``, an index), checked before torch is imported;
    class names need the model's labels and are checked later. A per-sample tuple holds
    indices or names."""
    from inspect_model.methods.objectives.targets import parse_target

    for text in target if isinstance(target, tuple) else (target,):
        raw = (text or "predicted").strip()
        if raw.lower().startswith("top:") or raw.lstrip("+-").isdigit():
            spec = parse_target(raw)
            if isinstance(target, tuple) and spec.kind != "class":
                raise UsageError(f"target '{raw}': a per-sample target holds class indices or names")


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(sizes: list[tuple[int, ...]], batch_size: int, *, bytes_per_value: int = 4) -> None:
    """Refuse a random input whose batch tensor alone would take over half this machine's
    RAM (issue 13): one line with the size and the memory needed, not an allocator crash.
    The model's activations need several times more; this is the floor."""
    import math

    ram = physical_memory()
    if not ram or not sizes:
        return
    need = sum(batch_size * math.prod(s) * bytes_per_value for s in sizes)
    if need > ram // 2:
        shape = "x".join(str(d) for d in (batch_size, *sizes[0]))
        raise InputError(
            f"an input of {shape} float32 values needs {need / 2**30:,.1f} GiB of memory before the model "
            f"even runs (this machine has {ram / 2**30:,.1f} GiB); use a smaller --input-size or --batch-size"
        )


def resolve_device(name: str) -> str:
    """``auto`` picks cuda, then mps, then cpu; an unavailable device is a usage error."""
    key = (name or "cpu").strip().lower()
    if key == "cpu":
        return key
    if key not in ("auto", "mps", "meta") and not key.startswith("cuda"):
        raise UsageError(f"--device '{name}' is not one of cpu, cuda, cuda:N, mps, auto")
    import torch

    if key == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if key.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
        if ":" in key:
            idx = int(key.split(":", 1)[1]) if key.split(":", 1)[1].isdigit() else -1
            if not 0 <= idx < torch.cuda.device_count():
                raise UsageError(f"--device {name}: no such CUDA device (found {torch.cuda.device_count()})")
        return key
    if key == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise UsageError("--device mps: MPS is not available on this machine; use --device cpu or auto")
        return key
    raise UsageError(f"--device '{name}' is not one of cpu, cuda, cuda:N, mps, auto")


def input_shape(inputs: InputOptions, default_batch: int | None = None) -> Any:
    """The batch and input size a run will feed (:class:`~inspect_model.loading.preflight.InputShape`),
    for the preflight's activation estimate: ``--batch-size`` (or the command's default; at most
    the number of image files named), one ``--input-size`` (else the model's default size)."""
    from inspect_model.loading.preflight import InputShape
    from inspect_model.loading.shapes import parse_size

    sizes = [parse_size(s) for s in inputs.input_size or []]
    size = sizes[0] if len(sizes) == 1 and "=" not in inputs.input_size[0] else None  # type: ignore[index]
    images = inputs.images
    if images is None or (isinstance(images, (list, tuple)) and not images):
        return InputShape(batch=inputs.batch_size or default_batch or 1, size=size)
    if hasattr(images, "shape"):  # a tensor (the API): its own batch and size
        return InputShape(batch=min(inputs.batch_size or int(images.shape[0]) or 1, int(images.shape[0]) or 1),
                          size=tuple(int(d) for d in images.shape[1:]))
    items = [images] if isinstance(images, (str, Path)) else list(images)
    batch = inputs.batch_size or default_batch or 8
    if all(isinstance(i, (str, Path)) and Path(i).is_file() for i in items):
        batch = min(batch, len(items))  # folders and globs may hold more: the batch asked for
    return InputShape(batch=batch, size=size)


def load(opts: ModelOptions, *, device: str | None = None, shape: Any = None) -> Any:
    """The :class:`~inspect_model.loading.loaded.LoadedModel` that ``opts`` names. A user's
    own module instance is wrapped as is (commands that change it get a private copy).
    ``shape``: the input the run will feed (:func:`input_shape`), for the preflight."""
    import warnings

    from torch import nn

    from inspect_model.loading.loaded import LoadedModel, infer_task
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.loading.sources import load_model
    from inspect_model.loading.wrappers import unwrap_loaded, unwrap_module

    dev = device or resolve_device(opts.device)
    if isinstance(opts.model, LoadedModel):
        loaded = unwrap_loaded(opts.model)
    elif isinstance(opts.model, nn.Module):
        # A compiled or DataParallel module: the one inside, named and tasked by its own class.
        inner, unwrapped = unwrap_module(opts.model)
        loaded = LoadedModel(model=inner, name=type(inner).__name__, source="python", borrowed=True,
                             task=infer_task(inner), notes=unwrapped)
        if opts.checkpoint:
            raise UsageError("checkpoint= applies to a model spec, not to a module object; load it yourself")
    elif isinstance(opts.model, str):
        placement = opts.placement()
        placement.check()
        if placement.active and str(opts.device).strip().lower() not in ("cpu", "auto"):
            raise UsageError(f"--device {opts.device} and --device-map/--max-memory/--offload: the device map says "
                             "where each block runs; drop --device")
        with warnings.catch_warnings():
            # torchvision builders warn about init defaults the user did not ask about.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            check = None
            if not placement.active:
                from inspect_model.loading.dispatch import fits_check, preflight

                preflight(opts.model.strip(), _request(opts, dev), tokens=128, shape=shape)
                check = fits_check(_request(opts, dev))
            loaded = load_model(
                opts.model,
                weights=opts.weights,
                device=dev,
                model_args=parse_model_args(opts.model_args),
                checkpoint=str(opts.checkpoint) if opts.checkpoint else None,
                strict=not opts.non_strict,
                trust_checkpoint=opts.trust_checkpoint,
                trust_remote_code=opts.trust_remote_code,
                dtype=opts.dtype,
                placement=placement,
                check=check,
            )
    else:
        raise InputError(f"expected an nn.Module or a model name, got {type(opts.model).__name__}")
    from inspect_model.loading.limits import check_module_depth

    check_module_depth(loaded.model, loaded.name)  # before torch's recursive walks (issue 41)
    want = parse_dtype(opts.dtype)
    if hasattr(loaded.model, "hf_device_map"):
        return loaded  # placed by accelerate, in --dtype already: never moved or cast as a whole
    other = _other_float_dtypes(loaded.model, want)
    if loaded.borrowed and (other or str(want) != "torch.float32"):
        # Commands cast the model to --dtype in place: give them a copy of the user's instance.
        from inspect_model.loading.user_models import private_copy

        loaded.model, loaded.borrowed = private_copy(loaded.model, opts.spec()), False
    if other:
        # A model saved in half precision fed --dtype inputs: "Input type (float) and bias
        # type (c10::Half) should be the same" in its first layer. Run it in --dtype.
        loaded.model.to(want)
        loaded.notes.append(f"the model's parameters are {', '.join(other)}; cast to "
                            f"{str(want).replace('torch.', '')} (--dtype) for this run")
    return loaded


def _request(opts: ModelOptions, device: str) -> Any:
    from inspect_model.loading.loaded import LoadRequest

    return LoadRequest(weights=opts.weights, device=device, trust_remote_code=opts.trust_remote_code,
                       dtype=opts.dtype, model_args=parse_model_args(opts.model_args))


def _other_float_dtypes(model: Any, want: Any) -> list[str]:
    """The floating dtypes of ``model``'s parameters other than ``want`` (none: it runs as is)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return []
    found = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return sorted(str(d).replace("torch.", "") for d in found - {want})
