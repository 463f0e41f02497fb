"""A command's Typer function, made from its registry entry and its request's fields.

The request class (api/) declares each option once: its flags, help, default and
completion. This module turns those fields into Typer parameters, adds the model argument,
the image arguments and the shared option groups (``@shared_options``), and gives the
command a body that builds the request (validated once, in the request) and hands it to
the API function through :func:`~inspect_model.cli.deliver.run_api`. Nothing here imports
torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from inspect_model.registry import CommandSpec
from inspect_model.run.request import Flag, flags_of
from inspect_model.cli import options as c
from inspect_model.cli import completion
from inspect_model.cli.deliver import run_api
from inspect_model.cli.groups import shared_options

COMPLETERS: dict[str, Callable[..., list[str]]] = {
    "layer": completion.complete_layer,
    "target": completion.complete_target,
    "colormap": completion.complete_colormap,
    "device": completion.complete_device,
}


def command_help(spec: CommandSpec) -> str:
    """The command's --help text: its paragraphs, then the example in a paragraph of its own."""
    return f"{spec.help}\n\nExample: {spec.example}"


def build(spec: CommandSpec) -> Callable[..., Any]:
    """The Typer function of ``spec``: hand-written (``spec.cli``) or made from its request."""
    if spec.cli is not None:
        return spec.cli
    request_cls = spec.request_class()
    fields = flags_of(request_cls)
    params = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=c.ModelArg)]
    if spec.images:
        params.append(inspect.Parameter("images", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=c.ImagesArg))
    names: dict[str, str] = {}  # Click parameter -> request field
    for name, default, flag in fields:
        param = flag.param or name
        names[param] = name
        annotation, cli_default = _annotation(name, default, flag, spec.name)
        params.append(inspect.Parameter(param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=cli_default,
                                        annotation=annotation))

    def body(*, opts: Any, inputs: Any, run_opts: Any, **kw: Any) -> None:
        kw.pop("model", None)
        kw.pop("images", None)
        values = {}
        for param, field_name in names.items():
            value = kw.pop(param)
            values[field_name] = tuple(value) if isinstance(value, list) else (() if value is None and
                                                                                 _is_multiple(param, fields)
                                                                                 else value)
        request = request_cls(**values)
        run_opts.check(save_raw=bool(getattr(request, "save_raw", False)))
        api_fn = spec.api_function()
        extra = {"on_stuck": stuck_exit} if "on_stuck" in inspect.signature(api_fn).parameters else {}
        run_api(spec.name, api_fn, opts, inputs, run_opts, streams=spec.streams, request=request, **extra)

    body.__name__ = spec.api_name
    body.__doc__ = command_help(spec)
    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    body.__annotations__ = {p.name: p.annotation for p in params}
    return shared_options(labels=spec.labels, images=spec.images, text=spec.text, run=spec.run,
                          two_models=spec.two_models)(body)


def stuck_exit(message: str) -> None:
    """A budget spent with the model stuck where it cannot be stopped (in C code: ``check
    --max-seconds``): one line on stderr and exit at once, with the failed check's code."""
    import os
    import sys

    from inspect_model.errors import CheckFailed

    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(CheckFailed.exit_code)


def _is_multiple(param: str, fields: list[tuple[str, Any, Flag]]) -> bool:
    return any((f.param or n) == param and f.multiple for n, _, f in fields)


def _annotation(name: str, default: Any, flag: Flag, command: str) -> tuple[Any, Any]:
    """(Typer annotation, CLI default) of one request field of ``command``."""
    kwargs: dict[str, Any] = {"help": flag.help() if callable(flag.help) else flag.help, "hidden": flag.hidden}
    if flag.complete == "method":  # the command's method family (its registry entry)
        kwargs["autocompletion"] = completion.method_completer(command)
    elif flag.complete is not None:
        kwargs["autocompletion"] = COMPLETERS[flag.complete]
    if flag.multiple:
        base = flag.type or str
        return Annotated[list[base] | None, typer.Option(*flag.flags, **kwargs)], None  # type: ignore[valid-type]
    base = flag.type or type(default)
    if default is None:
        return Annotated[base | None, typer.Option(*flag.flags, **kwargs)], None  # type: ignore[operator]
    if flag.type is not None and not isinstance(default, flag.type):  # e.g. a float field with an int default
        default = flag.type(default)
    return Annotated[base, typer.Option(*flag.flags, **kwargs)], default
