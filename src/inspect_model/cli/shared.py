"""The option groups the image subcommands share, declared once.

``@shared_options()`` appends the model, input and run options to a command's signature,
so Typer (and therefore ``--help``, completion and ``--config``) sees them as ordinary
options of that command, and calls the command with three objects instead of twenty-five
parameters: ``opts`` (:class:`ModelOptions`), ``inputs`` (:class:`InputOptions`) and
``run_opts`` (:class:`RunOptions`). The command keeps its own options and its ``model``
and ``images`` arguments.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspect_model.cli import common as c
from inspect_model.cli.run import CommandRun, InputOptions, JsonlOpt

MODEL_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("weights", c.WeightsOpt, "DEFAULT"),
    ("checkpoint", c.CheckpointOpt, None),
    ("model_arg", c.ModelArgOpt, None),
    ("non_strict", c.NonStrictOpt, False),
    ("trust_checkpoint", c.TrustOpt, False),
    ("device", c.DeviceOpt, "cpu"),
    ("dtype", c.DtypeOpt, "float32"),
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
)
RUN_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("output_dir", c.OutputDirOpt, None),
    ("force", c.ForceOpt, False),
    ("tensorboard", c.TensorboardOpt, None),
    ("json_", c.JsonOpt, False),
    ("jsonl", JsonlOpt, False),
    ("quiet", c.QuietOpt, False),
    ("config", c.ConfigOpt, None),  # read by cli/app.py before the command runs
    ("debug", c.DebugOpt, False),  # read by cli/app.py's error edge
)
_INJECTED = ("opts", "inputs", "run_opts")


@dataclass(frozen=True)
class RunOptions:
    """Where and how a run reports (see :class:`inspect_model.cli.run.CommandRun`)."""

    output_dir: Path | None
    force: bool
    tensorboard: Path | None
    json_: bool
    jsonl: bool
    quiet: bool


def shared_options(*, labels: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a subcommand taking ``model``, ``images``, its own options and the injected
    ``opts``/``inputs``/``run_opts``. ``labels=False`` leaves ``--labels`` out (for commands
    that name no classes)."""
    input_options = tuple(o for o in INPUT_OPTIONS if labels or o[0] != "labels")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(fn).parameters.values()
            if p.name not in _INJECTED
        ]
        groups = MODEL_OPTIONS + input_options + RUN_OPTIONS
        extra = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=a)
                 for n, a, d in groups]

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            opts = c.ModelOptions(kw["model"], *(kw.pop(n) for n, _, _ in MODEL_OPTIONS))
            given = {n: kw.pop(n) for n, _, _ in input_options}
            given["skip_bad"] = given.pop("skip_bad_inputs")
            inputs = InputOptions(kw.get("images"), **given)
            run_opts = RunOptions(*(kw.pop(n) for n, _, _ in RUN_OPTIONS[:6]))
            kw.pop("config"), kw.pop("debug")
            return fn(**kw, opts=opts, inputs=inputs, run_opts=run_opts)

        params = own + extra
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def command_run(command: str, run_opts: RunOptions, *, save_raw: bool = False) -> CommandRun:
    """The :class:`CommandRun` of one subcommand invocation."""
    r = run_opts
    return CommandRun(command, output_dir=r.output_dir, force=r.force, tensorboard=r.tensorboard, json_=r.json_,
                      jsonl=r.jsonl, quiet=r.quiet, save_raw=save_raw)
