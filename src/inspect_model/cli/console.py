"""The console: the one place that writes to stdout (the report: rich on a terminal, plain
text when piped, JSON with ``--json``) and stderr (messages, warnings routed to one-line notes).
Nothing here imports torch at module level, so ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from inspect_model.render.table import clean
class Messages:
    """stderr for progress, warnings and notes; silenced by --quiet (errors never are)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def info(self, text: str) -> None:
        if not self.quiet:
            print(clean(text), file=sys.stderr)

    def note(self, text: str) -> None:
        self.info(f"note: {text}")

    def warn(self, text: str) -> None:
        if not self.quiet:
            print(f"warning: {clean(text)}", file=sys.stderr)


@contextlib.contextmanager
def routed_warnings(quiet: bool = False) -> Iterator[None]:
    """Route every Python warning raised inside (matplotlib's missing glyph, numpy's "Mean
    of empty slice", torch's UserWarnings, the model's own) to the tool's one-line notes:
    each distinct message once as ``warning: <message>``, with ``(xN)`` for repeats, never
    with its source line (issue 13). Filters that ignore a warning or make it an error
    still apply; those that show it once per place become "count every one"."""
    import warnings

    from inspect_model.loading.hub_models import hub_quiet

    seen: list[str] = []  # in order; collapsed with counts by the pipeline's Warnings at the end

    def collect(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                line: Any = None) -> None:
        seen.append(str(message).strip() or getattr(category, "__name__", "warning"))

    # --quiet also silences the hub libraries' progress bars and logs while loading (issue 28).
    with warnings.catch_warnings(), hub_quiet(quiet):
        warnings.filters[:] = [("always", *f[1:]) if f[0] in ("default", "module", "once") else f
                               for f in warnings.filters]
        warnings.simplefilter("always", append=True)  # was the default action: once per place
        warnings.showwarning = collect
        try:
            yield
        finally:
            if seen:
                from inspect_model.run.session import Warnings, warning_lines

                collapsed = Warnings()
                collapsed.extend(seen)
                msgs = Messages(quiet)
                for text in warning_lines(collapsed.to_list()):
                    msgs.warn(text)


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
        from inspect_model.output.jsonout import dumps

        write_stdout(dumps(json_doc()) + "\n")
    elif rich is not None and stdout_is_terminal():
        from rich.console import Console

        console = Console()
        for part in rich():
            if isinstance(part, str):  # plain text: no markup, control characters escaped
                console.print(clean(part), markup=False, highlight=False)
            else:
                console.print(part)
    else:
        write_stdout(clean(text()))


def write_stdout(text: str) -> None:
    """``text`` to stdout, flushed; a closed or full stdout (``>&-``, ``>/dev/full``) is an
    output error. A reader that left (``| head``, BrokenPipeError) is the CLI edge's to end quietly."""
    from inspect_model.errors import OutputError

    if sys.stdout is None:
        raise OutputError("cannot write the report: stdout is closed; redirect it to a file or pass -o DIR")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: "I/O operation on closed file"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OutputError(f"cannot write the report to stdout: {reason}") from exc
