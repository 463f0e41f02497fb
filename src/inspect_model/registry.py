"""The command registry: one entry per command, registered beside its code.

Each command's API function carries its entry (timm's ``@register_model``): ::

    @command("cam", summary=..., help=..., example=..., schema="cam.json", gradients=True, ...)
    @api_command(CamRequest)
    def cam(model, images, request, ...): ...

An entry names the command's request (its options, from ``api_command``), its API function,
its renderer (the report on stdout), its report.html tables, its ``--method`` names and its
capabilities: ``hooks`` (refuses models that cannot be hooked), ``gradients`` (refuses
quantized models), ``objective`` (a flow model's pairs are scored), ``resumable``
(``--resume``, torchrun), ``text`` (``--text``). The CLI's subcommands (cli/app.py builds
them with cli/generate.py), shell completion, the lazy exports of ``inspect_model``
(``im.cam``), README's command table, the schema generator and those checks all read
:data:`COMMANDS`; no other list of command names decides anything. Adding a command is one
module under ``api/`` (request, session, decorated API function) and its test. The API
modules import no torch at import time, so reading the registry keeps ``--help`` instant.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CommandSpec:
    """One command (see the module docstring).

    ``request``: the request class, whose fields are the command's own options (None: the
    API function's own ``request_class``); ``api``: the API function; ``cli``: a
    hand-written Typer function for the few commands whose options are not a request
    (``models``; set by :func:`command_cli`), else None (generated). ``images``: takes
    IMAGE... arguments and the shared input options; ``labels``: has ``--labels``; ``run``:
    the run options it has (None: all); ``streams``: runs through the pipeline (per-image
    items, ``--jsonl``, ``--resume``)."""

    name: str
    summary: str  # one line: the --help list and README's command table
    help: str  # the command's --help text (paragraphs); its example comes after
    example: str
    api: Callable[..., Any]
    request: Any = None
    cli: Callable[..., Any] | None = None
    renderer: Callable[[Any, bool], Any] | None = None  # (result, rich) -> the report on stdout
    tables: Callable[[dict[str, Any]], list[Any]] | None = None  # report.html's tables of the --json document
    methods: Callable[[], tuple[str, ...]] | None = None  # its --method names (completion, the schema's enum)
    method_groups: tuple[str, ...] = ("all",)  # --method names that stand for several (completion)
    schema: str | None = None  # file name in inspect_model/schemas/
    report: Any = None  # the frozen record type whose to_dict() is the report body (its schema is generated)
    hooks: bool = True  # registers module hooks (refuses models that cannot be hooked)
    gradients: bool = False  # takes gradients (refuses quantized models; notes the input they are taken of)
    parameter_gradients: bool = False  # reads each parameter's gradient (refuses offloaded weights)
    objective: bool = False  # explains a score: a flow model's pairs are scored by their mean |flow|
    scores: bool = False  # explains a score: a task's scores (methods/families) replace the model's output
    resumable: bool = False  # its session keeps state for --resume and merges under torchrun
    images: bool = True
    labels: bool = True
    text: bool = False  # takes --text/--text-file/--tokenizer (Hugging Face text models; loading/text.py)
    two_models: bool = False  # a second positional that is no image names model B (compare A B IMAGE...)
    run: tuple[str, ...] | None = None
    streams: bool = True
    usage: str = ""  # README table: the command's arguments as typed (``cam MODEL IMAGE...``)
    order: int = 100  # place in --help and README's table

    @property
    def api_name(self) -> str:
        """The Python name: ``guided-backprop`` -> ``guided_backprop``."""
        return self.name.replace("-", "_")

    def api_function(self) -> Any:
        return self.api

    def request_class(self) -> Any:
        return self.request if self.request is not None else getattr(self.api, "request_class", None)


class _Commands(MutableMapping[str, CommandSpec]):
    """The entries, in their ``order``; the built-in commands (every module of ``api/``) are
    imported on first use."""

    def __init__(self) -> None:
        self._specs: dict[str, CommandSpec] = {}
        self._state = "empty"  # -> "loading" -> "loaded"

    def _load(self) -> dict[str, CommandSpec]:
        if self._state == "empty":
            self._state = "loading"
            try:
                importlib.import_module("inspect_model.api")
            finally:
                self._state = "loaded"
        return self._specs

    def __getitem__(self, name: str) -> CommandSpec:
        return self._load()[name]

    def __setitem__(self, name: str, spec: CommandSpec) -> None:
        self._specs[name] = spec
        self._specs = dict(sorted(self._specs.items(), key=lambda kv: kv[1].order))

    def __delitem__(self, name: str) -> None:
        del self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._load()))

    def __len__(self) -> int:
        return len(self._load())


COMMANDS: MutableMapping[str, CommandSpec] = _Commands()


def register(spec: CommandSpec, *, replace: bool = False) -> CommandSpec:
    """Add a command; ``replace`` to redefine one (tests)."""
    specs = COMMANDS._specs  # type: ignore[attr-defined]  # no load: the built-ins register while loading
    if spec.name in specs and not replace and specs[spec.name].api is not spec.api:
        raise ValueError(f"command '{spec.name}' is already registered")
    COMMANDS[spec.name] = spec
    return spec


def command(name: str, **fields: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator on a command's API function: register it (see the module docstring)."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        register(CommandSpec(name=name, api=fn, **fields))
        return fn

    return decorate


def command_cli(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator on a hand-written Typer function (cli/): the CLI of command ``name``."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        COMMANDS[name] = dataclasses.replace(COMMANDS[name], cli=fn)
        return fn

    return decorate


def unregister(name: str) -> None:
    COMMANDS.pop(name, None)


def get(name: str) -> CommandSpec:
    return COMMANDS[name]


def names() -> tuple[str, ...]:
    return tuple(COMMANDS)


def hook_commands() -> frozenset[str]:
    """Commands that register hooks (a model that cannot be hooked is refused by these)."""
    return frozenset(n for n, s in COMMANDS.items() if s.hooks)


def capability(command: str, what: str, default: bool = False) -> bool:
    """``what`` (hooks, gradients, objective, resumable, text) of ``command``; ``default`` for
    a name that is not a registered command (a bare API call of a method)."""
    spec = COMMANDS.get(command)
    return default if spec is None else bool(getattr(spec, what))


def with_capability(what: str) -> tuple[str, ...]:
    return tuple(n for n, s in COMMANDS.items() if getattr(s, what))


def command_table() -> str:
    """README's command table (a Markdown table), from the registry."""
    rows = ["| command | what it does |", "| --- | --- |"]
    rows += [f"| `{s.usage or s.name}` | {s.summary} |" for s in COMMANDS.values()]
    return "\n".join(rows)
