"""Click as Typer ships it: recent Typer vendors Click as ``typer._click``, older releases
depend on the ``click`` package. Exit/Abort are Typer's own classes in recent releases."""

from __future__ import annotations

try:  # typer >= 0.26 (vendored)
    from typer import _click as click  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older typer
    import click  # type: ignore[no-redef]

import typer

EXIT_TYPES: tuple[type[BaseException], ...] = tuple(
    {typer.Exit, getattr(click.exceptions, "Exit", typer.Exit)}
)
ABORT_TYPES: tuple[type[BaseException], ...] = tuple(
    {typer.Abort, getattr(click.exceptions, "Abort", typer.Abort)}
)

__all__ = ["ABORT_TYPES", "EXIT_TYPES", "click"]
