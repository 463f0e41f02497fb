"""A progress bar on stderr for long runs: only on a terminal, never with --quiet."""

from __future__ import annotations

import sys
from typing import Any

from inspect_model.cli.common import Messages


class Progress:
    """``with Progress(label, msgs) as progress: progress(done, total)``: a rich bar with
    counts and an ETA once there is more than one step to wait for; silent elsewhere.
    ``progress(done, total, label)`` drives one bar per label, so inner loops (Score-CAM's
    masked passes, the sanity check's models, grads' per-layer work) show under the images."""

    def __init__(self, label: str, msgs: Messages) -> None:
        self.label = label
        self.enabled = not msgs.quiet and _stderr_is_terminal()
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}

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
        key = label or self.label
        if key not in self._tasks:
            self._tasks[key] = self._bar.add_task(key, total=total)
        elif done < self._bar.tasks[self._tasks[key]].completed:
            self._bar.reset(self._tasks[key], total=total)  # an inner loop starting again (next batch)
        self._bar.update(self._tasks[key], completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
