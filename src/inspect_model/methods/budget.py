"""A time budget enforced as a timeout (``check --max-seconds``, issue 28): a model that
hangs fails the check when the budget is spent instead of keeping CI waiting forever.

Two guards, as far as the platform allows:

* ``SIGALRM`` (POSIX, main thread only): at the budget the handler raises
  :class:`OverBudget` in the main thread, which unwinds the model's Python code (and
  ``time.sleep``, lock waits and most blocking calls, which signals interrupt); the hooks
  are removed on the way out, as after any failure.
* a watchdog thread, when the caller gives ``on_stuck``: if the passes are still running
  a grace period after the budget (stuck in C code that never returns to Python, or with
  SIGALRM blocked), it calls ``on_stuck(message)``; the CLI prints one line and exits.

Elsewhere (Windows, a call from another thread) the time is measured after the passes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class OverBudget(BaseException):
    """The budget ran out during the passes. A BaseException, so that no ``except
    Exception`` in the model or around its forward pass swallows it."""


def grace(seconds: float) -> float:
    """How long after the budget the watchdog waits for SIGALRM's unwinding to finish."""
    return max(2.0, seconds)


@contextlib.contextmanager
def time_budget(seconds: float | None, on_stuck: Callable[[str], None] | None = None) -> Iterator[None]:
    """Raise :class:`OverBudget` inside the block ``seconds`` after it starts (see module)."""
    if seconds is None:
        yield
        return
    import signal

    done = threading.Event()
    watchdog = None
    if on_stuck is not None:
        wait = seconds + grace(seconds)

        def watch() -> None:
            if not done.wait(wait):
                on_stuck(f"check failed: time > {seconds:g} s (--max-seconds): the model did not return, "
                         f"and could not be stopped for {wait:g} s; exiting")

        watchdog = threading.Thread(target=watch, name="inspect-model-budget", daemon=True)
        watchdog.start()
    alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    old = None
    if alarm:
        def fire(signum: int, frame: object) -> None:
            raise OverBudget

        old = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        done.set()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        if watchdog is not None:
            watchdog.join(timeout=1.0)
