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
from inspect_model.cli import completion
from inspect_model.cli.activations import activations
from inspect_model.cli.attention import attention
from inspect_model.cli.cam import cam
from inspect_model.cli.check import check
from inspect_model.cli.common import routed_warnings
from inspect_model.cli.grads import grads
from inspect_model.cli.guided_backprop import guided_backprop
from inspect_model.cli.models import models
from inspect_model.cli.summary import summary
from inspect_model.render.table import clean

EXIT_HELP = "\n".join(f"  {code:>3}  {text}" for code, text in errors.EXIT_CODES.items())

app = typer.Typer(
    name="inspect-model",
    help=(
        "Open up PyTorch models: layer summaries, activations, gradients, guided backprop and "
        "class activation maps, for torchvision models by name or your own.\n\n"
        "Example: inspect-model summary resnet34\n\n"
        "Exit codes:\n\n" + "\n\n".join(f"{c}: {t}" for c, t in errors.EXIT_CODES.items())
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


COMMANDS: dict[str, Any] = {  # in the order `inspect-model --help` lists them
    "summary": summary,
    "models": models,
    "activations": activations,
    "grads": grads,
    "guided-backprop": guided_backprop,
    "cam": cam,
    "attention": attention,
    "check": check,
}


assert tuple(COMMANDS) == completion.COMMAND_NAMES


def _register() -> None:
    for name, fn in COMMANDS.items():
        app.command(name)(fn)


_register()


def _config_default_map(args: list[str]) -> dict[str, Any] | None:
    """``--config FILE`` for the subcommand on the line, as Click's ``default_map``: options
    from the file act as defaults, so the command line wins."""
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
    from inspect_model.config import load_config

    group = typer.main.get_command(app)
    params = {name: _command_params(name, group) for name in COMMANDS}
    return {command: load_config(path, command, params[command], all_params=params)}


def _command_params(command: str, group: Any = None) -> dict[str, Any]:
    """The Click parameters of ``command`` by name (``group``: the built app, to reuse)."""
    cmd = group if group is not None else typer.main.get_command(app)
    sub = cmd.commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in sub.params if p.name not in ("config", "debug", "help")}


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and exit with the documented code."""
    from inspect_model.cli._compat import ABORT_TYPES, EXIT_TYPES, click

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    code = 0
    restore = _on_signals()
    try:
        default_map = _config_default_map(args)
        # Python warnings become one-line notes, printed before any error line (issue 13).
        with routed_warnings(quiet="--quiet" in args or "-q" in args):
            rv = app(args=args, prog_name="inspect-model", standalone_mode=False, default_map=default_map)
        code = rv if isinstance(rv, int) else 0
    except SystemExit as exc:
        # Click and Typer leave by their own exceptions (caught below); a SystemExit here was
        # raised by the model's code (a factory, forward): never a silent pass for CI (issue 13).
        shown = "" if exc.code is None else repr(exc.code)
        print(f"error: model code called sys.exit({clean(shown)}); the model did not finish running",
              file=sys.stderr)
        code = errors.EXIT_RUNTIME
    except errors.Terminated:
        print("error: terminated (SIGTERM); partial outputs removed", file=sys.stderr)
        code = errors.EXIT_TERMINATED
    except errors.Interrupted:
        print("error: interrupted (Ctrl-C); partial outputs removed", file=sys.stderr)
        code = errors.EXIT_INTERRUPTED
    except MemoryError:
        print("error: out of memory; use a smaller --batch-size or --input-size, or fewer/smaller images",
              file=sys.stderr)
        code = errors.EXIT_RUNTIME
    except EXIT_TYPES as exc:
        code = exc.exit_code  # type: ignore[attr-defined]
        if isinstance(exc.__cause__, KeyboardInterrupt):  # Typer turns Ctrl-C into a silent Exit(130)
            print("error: interrupted (Ctrl-C); partial outputs removed", file=sys.stderr)
            code = errors.EXIT_INTERRUPTED
    except ABORT_TYPES:
        print("error: interrupted (Ctrl-C); partial outputs removed", file=sys.stderr)
        code = errors.EXIT_INTERRUPTED
    except click.exceptions.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:
            print(exc.ctx.get_help())
            sys.exit(0)
        where = f" (see 'inspect-model {exc.ctx.info_name} --help')" if exc.ctx and exc.ctx.parent else \
            " (see 'inspect-model --help')"
        print(f"error: {clean(exc.format_message())}{where}", file=sys.stderr)
        code = errors.EXIT_USAGE
    except click.exceptions.ClickException as exc:
        print(f"error: {clean(exc.format_message())}", file=sys.stderr)
        code = errors.EXIT_USAGE
    except errors.InspectModelError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        print(f"error: {clean(exc)}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); partial outputs removed", file=sys.stderr)
        code = errors.EXIT_INTERRUPTED
    except BrokenPipeError:
        # `inspect-model ... | head`: the reader left; not an error of ours.
        try:
            sys.stdout = None  # type: ignore[assignment]
        finally:
            code = 0
    except Exception as exc:  # the one catch-all: a bug or an unforeseen model failure
        if debug:
            import traceback

            traceback.print_exc()
        text = " ".join(str(exc).split())[:300]
        print(f"error: unexpected {type(exc).__name__}: {clean(text)} (run with --debug for a traceback)",
              file=sys.stderr)
        code = errors.EXIT_RUNTIME
    finally:
        restore()
    sys.exit(code)


def _on_signals() -> Any:
    """Turn SIGTERM and SIGINT into :class:`errors.Terminated` / :class:`errors.Interrupted`
    for the run, so that outputs are cleaned up and the edge prints one line; return what
    puts the old handlers back. Only in the main thread; an ignored SIGINT (a background
    job) stays ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum: int, frame: Any) -> None:
        raise errors.Terminated()

    def on_int(signum: int, frame: Any) -> None:
        raise errors.Interrupted()

    old_term = signal.signal(signal.SIGTERM, on_term)
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_int)

    def restore() -> None:
        signal.signal(signal.SIGTERM, old_term)
        if old_int is not signal.SIG_IGN and old_int is not None:
            signal.signal(signal.SIGINT, old_int)

    return restore
