"""The ``inspect-model`` Typer app: wires the subcommands and owns the one error edge.

``main()`` runs the app with Click's standalone mode off, so that every failure passes
through one place: an :class:`InspectModelError` becomes ``error: <message>`` on stderr and
its exit code; a usage error becomes one line and exit 2; anything unexpected becomes one
line and the runtime code. ``--debug`` (anywhere on the line) adds the traceback.
Importing this module must not import torch: ``--help`` stays instant.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from inspect_model import errors
from inspect_model import registry
from inspect_model.cli import models as _models, summary as _summary  # noqa: F401 - their @command_cli
from inspect_model.cli.console import routed_warnings
from inspect_model.cli.generate import build, command_help
from inspect_model.cli.optional_values import OptionalValueCommand
from inspect_model.render.table import clean
from inspect_model.settings import check_environment

EXIT_HELP = "\n".join(f"  {code:>3}: {text}" for code, text in errors.EXIT_CODES.items())

app = typer.Typer(
    name="inspect-model",
    help=(
        "Open up PyTorch models: layer summaries, activations, gradients, guided backprop and "
        "class activation maps, for torchvision models by name or your own.\n\n"
        "Example: inspect-model summary resnet34\n\n"
        "Exit codes:\n\n\b\n" + EXIT_HELP  # \b: click keeps these lines as they are, one per code
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        from inspect_model._version import __version__

        print(f"inspect-model {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show a traceback on errors."),
) -> None:
    """inspect-model: open up PyTorch models."""


def sync_commands(*, rebuild: bool = False) -> None:
    """One Typer command per registry entry, in the registry's order. Call it again after
    registering a command at run time (a plugin, a test's toy command); ``rebuild`` also
    makes the existing ones anew (their help reads the method registries: a new method)."""
    if rebuild or list(COMMANDS) != [n for n in registry.COMMANDS if n in COMMANDS]:
        COMMANDS.clear()
        app.registered_commands.clear()
    for spec in registry.COMMANDS.values():
        if spec.name not in COMMANDS:
            fn = build(spec)
            COMMANDS[spec.name] = fn
            app.command(spec.name, help=command_help(spec), short_help=spec.summary, cls=OptionalValueCommand)(fn)
    stale = [c for c in app.registered_commands if c.name not in registry.COMMANDS]
    for c in stale:  # unregistered since
        app.registered_commands.remove(c)
        COMMANDS.pop(str(c.name), None)


COMMANDS: dict[str, Any] = {}  # name -> Typer function, in the order `inspect-model --help` lists them
sync_commands()


def _config_default_map(args: list[str]) -> dict[str, Any] | None:
    """``--config FILE`` for the subcommand on the line, as Click's ``default_map``: options
    from the file act as defaults, so the command line wins. When the file names the model and
    the line's first positional names images, the model is put in front of them (in ``args``)."""
    path = None
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--config":
            if i + 1 >= len(args):
                return None  # Click reports the missing value
            path = args[i + 1]
        elif a.startswith("--config="):
            path = a.split("=", 1)[1]
    if path is None:
        return None
    # The subcommand is the first word that is not a root option (--debug, --version).
    command = next((a for a in args if not a.startswith("-")), None)
    if command is None or command not in COMMANDS:
        return None
    from inspect_model.config import check_no_code, is_image_argument, load_config

    group = typer.main.get_command(app)
    params = {name: _command_params(name, group) for name in COMMANDS}
    defaults = load_config(path, command, params[command], all_params=params)
    at = _first_positional(args, command, params[command])
    model = args[at] if at is not None else defaults.get("model")
    if at is not None and "model" in defaults and "images" in params[command] and is_image_argument(args[at]):
        args.insert(at, str(defaults["model"]))  # issue 29: `cam --config c.toml cat.jpg`
        model = defaults["model"]
    check_no_code(path, defaults, model)
    return {command: defaults}


def _first_positional(args: list[str], command: str, params: dict[str, Any]) -> int | None:
    """The index in ``args`` of the first positional argument after ``command``, or None."""
    takes_value = {name for p in params.values() if not getattr(p, "is_flag", True) or getattr(p, "nargs", 1) > 1
                   for name in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
                   if name.startswith("-")} | {"--config"}
    i = args.index(command) + 1
    while i < len(args):
        a = args[i]
        if a == "--":
            return i + 1 if i + 1 < len(args) else None
        if not a.startswith("-") or a == "-":
            return i
        i += 2 if a in takes_value else 1
    return None


def _command_params(command: str, group: Any = None) -> dict[str, Any]:
    """The Click parameters of ``command`` by name (``group``: the built app, to reuse)."""
    cmd = group if group is not None else typer.main.get_command(app)
    sub = cmd.commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in sub.params if p.name not in ("config", "debug", "help")}


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and exit with the documented code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    code = 0
    restore = _on_signals()
    try:
        check_environment()  # a bad INSPECT_MODEL_* value: one usage error before anything runs
        default_map = _config_default_map(args)
        # Python warnings become one-line notes, printed before any error line (issue 13).
        with routed_warnings(quiet="--quiet" in args or "-q" in args):
            rv = app(args=args, prog_name="inspect-model", standalone_mode=False, default_map=default_map)
        code = rv if isinstance(rv, int) else 0
    except BaseException as exc:  # the one error edge: see _exit_code
        code = _exit_code(exc, debug)
    finally:
        restore()
    sys.exit(code)


_INTERRUPTED = "interrupted (Ctrl-C); partial outputs removed"


def _exit_code(exc: BaseException, debug: bool) -> int:
    """Print ``exc``'s one line on stderr and return its exit code; called while ``exc`` is
    being handled (``--debug`` prints its traceback). What it does not know is re-raised;
    Click's own finished exits (completion, a bare ``inspect-model``) leave with ``sys.exit``."""
    from inspect_model.cli._compat import ABORT_TYPES, EXIT_TYPES, click

    if isinstance(exc, SystemExit):
        return _system_exit_code(exc)
    if isinstance(exc, errors.Terminated):
        if exc.hangup:  # the terminal closed: like SIGTERM, with its own code (issue 41)
            return _fail("hung up (SIGHUP); partial outputs removed", errors.EXIT_HANGUP)
        return _fail("terminated (SIGTERM); partial outputs removed", errors.EXIT_TERMINATED)
    if isinstance(exc, errors.Interrupted):
        return _fail(_INTERRUPTED, errors.EXIT_INTERRUPTED)
    if isinstance(exc, MemoryError):
        return _fail(errors.out_of_memory(exc), errors.EXIT_RUNTIME)
    if isinstance(exc, EXIT_TYPES):
        if isinstance(exc.__cause__, KeyboardInterrupt):  # Typer turns Ctrl-C into a silent Exit(130)
            return _fail(_INTERRUPTED, errors.EXIT_INTERRUPTED)
        return exc.exit_code  # type: ignore[attr-defined, no-any-return]
    if isinstance(exc, ABORT_TYPES):
        return _fail(_INTERRUPTED, errors.EXIT_INTERRUPTED)
    if isinstance(exc, click.exceptions.UsageError):
        return _usage_error_code(exc)
    if isinstance(exc, click.exceptions.ClickException):
        return _fail(clean(exc.format_message()), errors.EXIT_USAGE)
    if isinstance(exc, errors.InspectModelError):
        _traceback(debug)
        oom = _out_of_memory(exc)  # torch's allocators raise RuntimeError, maybe wrapped in ours (issue 28)
        return _fail(clean(oom or exc), errors.EXIT_RUNTIME if oom else exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return _fail(_INTERRUPTED, errors.EXIT_INTERRUPTED)
    if isinstance(exc, BrokenPipeError):
        # `inspect-model ... | head`: the reader left; not an error of ours.
        sys.stdout = None  # type: ignore[assignment]
        return 0
    if isinstance(exc, RecursionError):  # a model (or its output) nested past Python's recursion limit
        _traceback(debug)
        return _fail(f"the model nests modules or outputs too deeply for Python (over its recursion limit of "
                     f"{sys.getrecursionlimit()} calls); flatten it", errors.EXIT_RUNTIME)
    if isinstance(exc, Exception):  # the one catch-all: a bug or an unforeseen model failure
        _traceback(debug)
        oom = _out_of_memory(exc)
        text = oom or f"unexpected {type(exc).__name__}: {errors.one_line(exc)} (run with --debug for a traceback)"
        return _fail(clean(text), errors.EXIT_RUNTIME)
    raise exc


def _fail(text: Any, code: int) -> int:
    print(f"error: {text}", file=sys.stderr)
    return code


def _traceback(debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()


def _system_exit_code(exc: SystemExit) -> int:
    if isinstance(exc.__context__, BrokenPipeError):
        # Click leaves with exit 1 when stdout's reader left (`--jsonl | head -c 20`); README:
        # a reader leaving is no error of ours, exit 0, and nothing more is written (issue 41).
        sys.stdout = None  # type: ignore[assignment]
        return 0
    if _from_cli_framework(exc):  # shell completion, --show-completion: Click's own, finished exit
        code = exc.code if isinstance(exc.code, int) else 0
        sys.exit(code)
    # Click and Typer leave by their own exceptions (handled in _exit_code); a SystemExit here
    # was raised by the model's code (a factory, forward): never a silent pass for CI (issue 13).
    shown = "" if exc.code is None else repr(exc.code)
    return _fail(f"model code called sys.exit({clean(shown)}); the model did not finish running",
                 errors.EXIT_RUNTIME)


def _usage_error_code(exc: Any) -> int:
    """One line naming the command's ``--help``; a bare command group prints its help, exit 0."""
    if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:
        print(exc.ctx.get_help())
        sys.exit(0)
    where = f" (see 'inspect-model {exc.ctx.info_name} --help')" if exc.ctx and exc.ctx.parent else \
        " (see 'inspect-model --help')"
    return _fail(f"{clean(exc.format_message())}{where}", errors.EXIT_USAGE)


def _from_cli_framework(exc: SystemExit) -> bool:
    """True when Click or Typer itself raised ``exc`` (shell completion answers with
    ``sys.exit``; so does ``--show-completion``), not the model's code: the innermost frame
    of its traceback lies in their packages (or Typer's vendored Click)."""
    import os

    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    if last is None:
        return False
    parts = set(os.path.normpath(last).split(os.sep))
    return bool(parts & {"click", "typer", "_click", "shellingham"})


def _out_of_memory(exc: BaseException) -> str | None:
    """The out-of-memory message if ``exc`` or any exception it came from is one."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        msg = errors.out_of_memory(cur)
        if msg is not None:
            return msg
        cur = cur.__cause__ or cur.__context__
    return None


def _on_signals() -> Any:
    """Turn SIGTERM and SIGINT into :class:`errors.Terminated` / :class:`errors.Interrupted`
    for the run, so that outputs are cleaned up and the edge prints one line, and let a
    file-size limit fail the write (EFBIG, exit 7) instead of killing the process; return
    what puts the old handlers back (see :mod:`inspect_model.run.signals`)."""
    from inspect_model.run.signals import install

    return install()
