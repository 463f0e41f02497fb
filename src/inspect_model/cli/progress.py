"""Progress of long runs on stderr, never with --quiet: a rich bar on a terminal; off a
terminal (CI logs, ``2> log``) one plain line every :data:`INTERVAL_ENV` seconds (30 by
default) with done/total, the rate and the time left, so that a 46-minute Score-CAM run in
CI is not silent until its end (issue 29)."""

from __future__ import annotations

import sys
import time
from typing import Any

from inspect_model.cli.console import Messages

INTERVAL_ENV = "INSPECT_MODEL_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0


def progress_interval() -> float:
    """Seconds between two progress lines off a terminal: ``INSPECT_MODEL_PROGRESS_SECONDS``
    (a number > 0), else 30. A bad value is a usage error, never silently ignored."""
    from inspect_model.settings import env_float

    return env_float(INTERVAL_ENV, DEFAULT_INTERVAL, positive=True)


def format_rate(done: float, seconds: float, unit: str = "image") -> str:
    """``12.3 images/s``, or for slow work ``45.1 s/image`` (never ``0.0 images/s``)."""
    if done <= 0 or seconds <= 0:
        return f"- {unit}s/s"
    rate = done / seconds
    if rate >= 1.0:
        return f"{rate:.1f} {unit}s/s"
    if rate >= 0.1:
        return f"{rate:.2f} {unit}s/s ({1 / rate:.1f} s/{unit})"
    return f"{1 / rate:.1f} s/{unit}"


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """``with Progress(label, msgs) as progress: progress(done, total)``: a rich bar with
    counts and an ETA once there is more than one step to wait for; silent elsewhere.
    ``progress(done, total, label)`` drives one bar per label, so inner loops (Score-CAM's
    masked passes, the sanity check's models, grads' per-layer work) show under the images.
    Off a terminal: a line on stderr at most every :func:`progress_interval` seconds."""

    def __init__(self, label: str, msgs: Messages) -> None:
        self.label = label
        self.terminal = _stderr_is_terminal()
        self.enabled = not msgs.quiet and self.terminal
        self.lines = not msgs.quiet and not self.terminal
        self.interval = progress_interval() if self.lines else DEFAULT_INTERVAL
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self._start = time.monotonic()
        self._last_line = self._start
        self._state: dict[str, tuple[int, int, float]] = {}  # label -> (done, total, started)
        self.unit = "image"  # what the outer count counts (the input plan's: image, text, clip, pair)

    def set_unit(self, unit: str) -> None:
        self.unit = unit

    def __enter__(self) -> Progress:
        return self

    def __call__(self, done: int, total: int, label: str | None = None) -> None:
        if self.lines:
            self._line(done, total, label)
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

    def _line(self, done: int, total: int, label: str | None) -> None:
        now = time.monotonic()
        key = label or self.label
        have = self._state.get(key)
        # The rate counts from the first call (done 0: the first batch starts, after loading), so
        # it agrees with the final "N image(s) in S s" line (issue 39).
        started = have[2] if have is not None and done >= have[0] else (
            self._start if label is None and done > 0 else now)
        self._state[key] = (done, total, started)
        if now - self._last_line < self.interval:
            return
        self._last_line = now
        parts = [self._describe(self.label, self.unit, now)] if self.label in self._state else []
        if key != self.label:
            parts.append(self._describe(key, "step", now))
        if parts:
            print(f"progress: {'; '.join(parts)}; {format_duration(now - self._start)} elapsed",
                  file=sys.stderr, flush=True)

    def _describe(self, key: str, unit: str, now: float) -> str:
        done, total, started = self._state[key]
        text = f"{key}: {done}/{total}" + (f" {unit}s" if unit != "step" else "")
        seconds = now - started
        text += f", {format_rate(done, seconds, unit)}"
        if 0 < done < total and seconds > 0:
            text += f", ETA {format_duration((total - done) * seconds / done)}"
        return text

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
