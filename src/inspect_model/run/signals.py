"""Signals during a run: SIGTERM unwinds it like Ctrl-C (outputs cleaned up, or a resumable
state kept), then the CLI's edge says so in one line and exits 143.

The CLI installs its handlers first thing (``inspect_model.__main__`` / the console script,
before the heavy imports) so that a signal at any moment gives one line, no traceback. The
runner installs its own only where nobody did (an API caller, a torchrun driver script):
torchrun stops the other ranks with SIGTERM when one fails, and each must unwind.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from inspect_model.errors import Interrupted, Terminated


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


# SIGHUP (the terminal or ssh session closed) unwinds like SIGTERM (issue 41); nohup's
# ignored SIGHUP stays ignored.
_HUP = getattr(signal, "SIGHUP", None)


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted()


def install() -> Callable[[], None]:
    """SIGTERM and SIGHUP raise :class:`Terminated`, SIGINT :class:`Interrupted` (an ignored SIGINT, a
    background job's, stays ignored); SIGXFSZ is ignored so that a file-size limit makes
    the write fail (EFBIG: an output error) instead of killing the process. Returns what
    puts the old handlers back. Only in the main thread (elsewhere: nothing, a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old: dict[int, Any] = {}
    try:
        old[signal.SIGTERM] = signal.signal(signal.SIGTERM, _raise_terminated)
        if _HUP is not None and signal.getsignal(_HUP) is not signal.SIG_IGN:
            old[_HUP] = signal.signal(_HUP, _raise_terminated)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            old[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_interrupted)
        if hasattr(signal, "SIGXFSZ"):
            old[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except (ValueError, OSError):
        pass

    def restore() -> None:
        for sig, handler in old.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    return restore


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within a run: SIGTERM raises :class:`Terminated` unless a handler is already set
    (the CLI's, or the caller's own), so that the run cleans up after itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        current = None
    if current not in (signal.SIG_DFL, None):
        yield
        return
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_terminated)}
    if _HUP is not None and signal.getsignal(_HUP) is signal.SIG_DFL:
        old[_HUP] = signal.signal(_HUP, _raise_terminated)
    try:
        yield
    finally:
        for sig, handler in old.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)
