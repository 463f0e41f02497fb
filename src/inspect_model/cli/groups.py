"""The option groups the image commands share, declared once.

``@shared_options()`` appends the model, input and run options to a command's signature,
so Typer (and therefore ``--help``, completion and ``--config``) sees them as ordinary
options of that command, and calls the command with three objects instead of twenty-five
parameters: ``opts`` (:class:`ModelOptions`), ``inputs`` (:class:`InputOptions`) and
``run_opts`` (:class:`RunOptions`). :func:`inspect_model.cli.deliver.run_api` calls an API
function with them and delivers its result.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from inspect_model.run.options import (
    InputOptions,
    ModelOptions,
)
from inspect_model.cli import options as c
from inspect_model.errors import UsageError

JsonlOpt = Annotated[
    bool, typer.Option("--jsonl", help="Write one compact JSON object per image to stdout as each batch finishes.")
]
ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Keep the run's state in --output-dir after every batch; the same "
                       "command continues an unfinished run there, skipping the images already done.")
]
WorkersOpt = Annotated[
    int, typer.Option("--workers", help="Processes decoding and preprocessing images (torch DataLoader); 0: "
                      "in the main process.")
]
MODEL_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("weights", c.WeightsOpt, "DEFAULT"),
    ("checkpoint", c.CheckpointOpt, None),
    ("model_arg", c.ModelArgOpt, None),
    ("non_strict", c.NonStrictOpt, False),
    ("trust_checkpoint", c.TrustOpt, False),
    ("trust_remote_code", c.TrustRemoteCodeOpt, False),
    ("device", c.DeviceOpt, "cpu"),
    ("dtype", c.DtypeOpt, "float32"),
    ("device_map", c.DeviceMapOpt, None),
    ("max_memory_map", c.MaxMemoryOpt, None),  # `check` keeps its own --max-memory (a budget)
    ("offload", c.OffloadOpt, None),
    ("offload_dir", c.OffloadDirOpt, None),
)
INPUT_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("input_size", c.InputSizeOpt, None),
    ("batch_size", c.ImageBatchSizeOpt, None),
    ("seed", c.SeedOpt, 0),
    ("preset", c.PresetOpt, None),
    ("resize", c.ResizeOpt, None),
    ("crop", c.CropOpt, None),
    ("mean", c.MeanOpt, None),
    ("std", c.StdOpt, None),
    ("labels", c.LabelsOpt, None),
    ("skip_bad_inputs", c.SkipBadOpt, False),
    ("image_input", c.ImageInputOpt, None),
    ("inputs_file", c.InputsFileOpt, None),
    ("clip", c.ClipOpt, False),
    ("frames", c.FramesOpt, None),
    ("stride", c.StrideOpt, 1),
    ("clips", c.ClipsOpt, 1),
    ("text", c.TextOpt, None),
    ("text_file", c.TextFileOpt, None),
    ("tokenizer", c.TokenizerOpt, None),
    ("target_text", c.TargetTextOpt, None),
    ("position", c.PositionOpt, None),
    ("contrast", c.ContrastOpt, None),
    ("task", c.TaskOpt, None),
)
TEXT_OPTIONS = ("text", "text_file", "tokenizer", "target_text", "position", "contrast")  # only commands that take text (CommandSpec.text)
RUN_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("output_dir", c.OutputDirOpt, None),
    ("force", c.ForceOpt, False),
    ("wait", c.WaitOpt, False),
    ("tensorboard", c.TensorboardOpt, None),
    ("json_", c.JsonOpt, False),
    ("jsonl", JsonlOpt, False),
    ("quiet", c.QuietOpt, False),
    ("resume", ResumeOpt, False),
    ("workers", WorkersOpt, 0),
    ("config", c.ConfigOpt, None),  # read by cli/app.py before the command runs
    ("debug", c.DebugOpt, False),  # read by cli/app.py's error edge
)
_INJECTED = ("opts", "inputs", "run_opts")


@dataclass(frozen=True)
class RunOptions:
    """Where and how a run reports."""

    output_dir: Path | None = None
    force: bool = False
    wait: bool = False
    tensorboard: Path | None = None
    json_: bool = False
    jsonl: bool = False
    quiet: bool = False
    resume: bool = False
    workers: int = 0

    def check(self, *, save_raw: bool = False) -> None:
        if self.json_ and self.jsonl:
            raise UsageError("--json and --jsonl cannot be combined; choose one")
        if self.workers < 0:
            raise UsageError(f"--workers must be 0 or more, got {self.workers}")
        for flag, path, why in (("--output-dir", self.output_dir, "; without it the report goes to stdout"),
                                ("--tensorboard", self.tensorboard, "")):
            if path is not None and str(path) == "-":
                raise UsageError(f"{flag} takes a folder, not '-' (a stream){why}; "
                                 "give a folder named '-' by its full path")
        for flag, on in (("--save-raw", save_raw), ("--force", self.force), ("--resume", self.resume),
                         ("--wait", self.wait)):
            if on and self.output_dir is None:
                raise UsageError(f"{flag} needs --output-dir DIR")
        if self.tensorboard is not None:
            from inspect_model.output.tensorboard import require_tensorboard

            require_tensorboard()


def shared_options(*, labels: bool = True, images: bool = True, text: bool = False,
                   run: tuple[str, ...] | None = None, two_models: bool = False
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command taking ``model``, ``images``, its own options and the injected
    ``opts``/``inputs``/``run_opts``. ``labels=False`` leaves ``--labels`` out (for commands
    that name no classes), ``text`` adds ``--text``/``--text-file``/``--tokenizer``; ``run`` names the run options the command has (default: all).
    ``two_models``: a first IMAGE argument that names no image is model B (``--against-model``)."""
    input_options = tuple(o for o in INPUT_OPTIONS if (labels or o[0] != "labels")
                          and (images or o[0] not in ("preset", "resize", "crop", "mean", "std", "skip_bad_inputs"))
                          and (text or o[0] not in TEXT_OPTIONS))
    run_options = tuple(o for o in RUN_OPTIONS if run is None or o[0] in run or o[0] in ("config", "debug")
                        or (o[0] == "wait" and "output_dir" in run))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(fn).parameters.values()
            if p.name not in _INJECTED
        ]
        names = {p.name for p in own}
        model_options = tuple(o for o in MODEL_OPTIONS if not (o[0] == "max_memory_map" and "max_memory" in names))
        groups = model_options + input_options + run_options
        extra = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=a)
                 for n, a, d in groups]

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            mo = {n: kw.pop(n) for n, _, _ in model_options}
            opts = ModelOptions(kw["model"], weights=mo["weights"], checkpoint=mo["checkpoint"],
                                model_args=mo["model_arg"], non_strict=mo["non_strict"],
                                trust_checkpoint=mo["trust_checkpoint"], device=mo["device"], dtype=mo["dtype"],
                                trust_remote_code=mo["trust_remote_code"], device_map=mo["device_map"],
                                max_memory=mo.get("max_memory_map"), **offload_fields(mo["offload"], mo["offload_dir"]))
            opts.placement().check()
            if two_models:
                _second_model(kw)
            given = {n: kw.pop(n) for n, _, _ in input_options}
            given["skip_bad"] = given.pop("skip_bad_inputs", False)
            inputs = InputOptions(kw.get("images"), **given)  # checked once, as it is made
            if inputs.text or inputs.text_file is not None:  # a folder without a tokenizer: before torch (issue 37)
                from inspect_model.loading.text import precheck_tokenizer

                precheck_tokenizer(opts.model, inputs.tokenizer)
            ro = {n: kw.pop(n) for n, _, _ in run_options if n not in ("config", "debug")}
            kw.pop("config"), kw.pop("debug")
            return fn(**kw, opts=opts, inputs=inputs, run_opts=RunOptions(**ro))

        params = own + extra
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def offload_fields(offload: str | None, offload_dir: str | None) -> dict[str, Any]:
    """``--offload [DIR]`` (and the older ``--offload-dir DIR``) as ModelOptions' fields:
    ``--offload`` alone ("") is a temporary folder, ``--offload DIR`` that folder."""
    if offload and offload_dir and offload != offload_dir:
        raise UsageError(f"--offload {offload} and --offload-dir {offload_dir}: give one folder")
    folder = offload or offload_dir or None
    return {"offload": offload is not None or folder is not None, "offload_dir": folder}


def _second_model(kw: dict[str, Any]) -> None:
    """``compare A B IMAGE...``: the first positional after A is B when it names no image."""
    from inspect_model.config import is_image_argument

    images = kw.get("images") or []
    if images and kw.get("against_model") is None and not is_image_argument(str(images[0])):
        kw["against_model"] = images[0]
        kw["images"] = list(images[1:]) or None
