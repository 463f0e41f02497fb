"""A progress bar on stderr for long runs: only on a terminal, never with --quiet."""

from __future__ import annotations

import sys
from typing import Any

from inspect_model.cli.common import Messages


class Progress:
    """``with Progress(label, msgs) as progress: progress(done, total)``: a rich bar with
    counts and an ETA once there is more than one step to wait for; silent elsewhere."""

    def __init__(self, label: str, msgs: Messages) -> None:
        self.label = label
        self.enabled = not msgs.quiet and _stderr_is_terminal()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        return self

    def __call__(self, done: int, total: int, label: str | None = None) -> None:
        if not self.enabled or total <= 1:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label or self.label, total=total)
        self._bar.update(self._task, completed=done, total=total, description=label or self.label)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
