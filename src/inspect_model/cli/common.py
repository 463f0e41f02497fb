"""Options shared by the subcommands, and the helpers that write reports.

Only this package writes to the console: stdout gets the report (rich on a terminal,
plain text when piped, JSON with ``--json``), stderr gets messages. Nothing here imports
torch at module level, so ``--help`` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from inspect_model.cli import completion
from inspect_model.errors import UsageError

# ---------------------------------------------------------------- option types
ModelArg = Annotated[
    str,
    typer.Argument(
        help="A torchvision model name (resnet34, torchvision:vit_b_16), a user model "
        "FILE.py:FACTORY or package.module:ATTR (this runs that code), or a TorchScript file.",
        show_default=False,
        metavar="MODEL",
        autocompletion=completion.complete_model,
    ),
]
WeightsOpt = Annotated[
    str | None,
    typer.Option("--weights", help="none, DEFAULT, or a weights enum member (IMAGENET1K_V2)."),
]
CheckpointOpt = Annotated[
    Path | None,
    typer.Option("--checkpoint", help="Load this state_dict (or a dict holding one) into the model."),
]
ModelArgOpt = Annotated[
    list[str] | None,
    typer.Option("--model-arg", help="key=value passed to a user model's constructor (repeatable)."),
]
NonStrictOpt = Annotated[
    bool, typer.Option("--non-strict", help="Allow missing/unexpected checkpoint keys.")
]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-checkpoint",
        help="Allow full unpickling of checkpoints (runs code from the file: only for files you trust).",
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, float16, bfloat16 or float64.")]
InputSizeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-size", help="Per-sample input shape such as 3x224x224 (repeat for several inputs)."),
]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="Batch size.")]
ImageBatchSizeOpt = Annotated[
    int | None,
    typer.Option("--batch-size", help="Images per forward pass (default 8); without images, how many "
                 "seeded random inputs to make (default 1)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Write the report to stdout as one JSON document.")]
OutputDirOpt = Annotated[
    Path | None, typer.Option("--output-dir", "-o", help="Write the report's files into this directory.")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Write into a non-empty --output-dir.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on stderr but errors.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show a traceback on errors.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="TOML file setting any option of this command (the command line wins)."),
]
DepthOpt = Annotated[int | None, typer.Option("--depth", help="Only modules down to this nesting depth.")]
LayersOpt = Annotated[
    list[str] | None,
    typer.Option("--layers", "-l", help="Layer spec: name, glob (layer4.*), type:Conv2d, with [i] (repeatable).",
                 autocompletion=completion.complete_layer),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for random inputs and sampling.")]


@dataclass
class ModelOptions:
    """What every subcommand needs to load a model."""

    model: str
    weights: str | None
    checkpoint: Path | None = None
    model_args: list[str] | None = None
    non_strict: bool = False
    trust_checkpoint: bool = False
    device: str = "cpu"
    dtype: str = "float32"


def parse_model_args(items: list[str] | None) -> dict[str, Any]:
    """``['depth=3', 'name="x"']`` to a dict; values are Python literals, else strings."""
    import ast

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


def resolve_device(name: str) -> str:
    """``auto`` picks cuda, then mps, then cpu; an unavailable device is a usage error."""
    import torch

    key = (name or "cpu").strip().lower()
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
    if key == "cpu":
        return key
    raise UsageError(f"--device '{name}' is not one of cpu, cuda, cuda:N, mps, auto")


def load(opts: ModelOptions, *, device: str | None = None) -> Any:
    """Load the model named by ``opts`` (see :func:`inspect_model.loading.models.load_model`)."""
    import warnings

    from inspect_model.loading.models import load_model

    with warnings.catch_warnings():
        # torchvision builders warn about init defaults the user did not ask about.
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        loaded = load_model(
            opts.model,
            weights=opts.weights,
            device=device or resolve_device(opts.device),
            model_args=parse_model_args(opts.model_args),
            checkpoint=str(opts.checkpoint) if opts.checkpoint else None,
            strict=not opts.non_strict,
            trust_checkpoint=opts.trust_checkpoint,
        )
    from inspect_model.loading.shapes import parse_dtype

    if loaded.borrowed and str(parse_dtype(opts.dtype)) != "torch.float32":
        # Commands cast the model to --dtype in place: give them a copy of the user's instance.
        from inspect_model.loading.user_models import private_copy

        loaded.model, loaded.borrowed = private_copy(loaded.model, opts.model), False
    return loaded


# ---------------------------------------------------------------- consoles
class Messages:
    """stderr for progress, warnings and notes; silenced by --quiet (errors never are)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def info(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr)

    def warn(self, text: str) -> None:
        if not self.quiet:
            print(f"warning: {text}", file=sys.stderr)


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def emit(
    *,
    as_json: bool,
    json_doc: Callable[[], dict[str, Any]],
    text: Callable[[], str],
    rich: Callable[[], list[Any]] | None = None,
) -> None:
    """Write the report to stdout in the one format the user asked for."""
    if as_json:
        from inspect_model.render.jsonout import dumps

        sys.stdout.write(dumps(json_doc()) + "\n")
    elif rich is not None and stdout_is_terminal():
        from rich.console import Console

        console = Console()
        for part in rich():
            console.print(part)
    else:
        sys.stdout.write(text())
    sys.stdout.flush()


# ---------------------------------------------------------------- inputs
ImagesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Images: files, directories (recursive), globs, or - to read paths from stdin. "
        "Without images a seeded random input of --input-size is used.",
        show_default=False,
    ),
]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="Preprocessing preset: imagenet, inception, clip, unit.")]
ResizeOpt = Annotated[int | None, typer.Option("--resize", help="Resize the shorter side to this many pixels.")]
CropOpt = Annotated[int | None, typer.Option("--crop", help="Centre-crop to this square size.")]
MeanOpt = Annotated[str | None, typer.Option("--mean", help="Normalisation mean, e.g. 0.485,0.456,0.406.")]
StdOpt = Annotated[str | None, typer.Option("--std", help="Normalisation std, e.g. 0.229,0.224,0.225.")]
LabelsOpt = Annotated[Path | None, typer.Option("--labels", help="Class names: one per line, or JSON.")]
SkipBadOpt = Annotated[
    bool, typer.Option("--skip-bad-inputs", help="Skip unreadable images with a warning instead of failing.")
]
TargetOpt = Annotated[
    str, typer.Option("--target", "-t", help="predicted, a class index or name, or top:K.")
]
OutputKeyOpt = Annotated[
    str | None, typer.Option("--output-key", help="Which output of a tuple/dict-returning model to use (name or index).")
]
SaveRawOpt = Annotated[bool, typer.Option("--save-raw", help="Also save raw arrays as .npy files.")]
TensorboardOpt = Annotated[
    Path | None, typer.Option("--tensorboard", help="Also write TensorBoard events here (needs the tensorboard extra).")
]


def parse_floats(text: str | None, option: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise UsageError(f"{option} '{text}' is not a comma-separated list of numbers") from exc
