"""The console script (``inspect-model``, ``python -m inspect_model``): signal handlers come
first, before the heavy imports, and the process ends when the report is done.

- A Ctrl-C or SIGTERM while the CLI is still importing (its first tens of milliseconds)
  prints one line and exits 130/143, not a traceback (issue 28); from then on the CLI's
  own handlers (``cli/app.py``) unwind the run and clean up.
- A model that leaves a non-daemon thread running would keep the interpreter alive after
  the report: the process exits anyway, with a warning naming the threads (issue 28).
- A torchrun rank ends the same way, after the exit functions (which destroy the process
  group): no interpreter finalization, so no C++ thread that something still ties to the
  group (gloo's workers) can abort the process while Python shuts down.

This module imports nothing heavy: only ``os``, ``signal``, ``sys`` and ``threading``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def _early(signum: int, frame: Any) -> None:
    what, code = (("interrupted (Ctrl-C)", 130) if signum == signal.SIGINT else
                  ("hung up (SIGHUP)", 129) if signum == getattr(signal, "SIGHUP", None) else
                  ("terminated (SIGTERM)", 143))
    try:
        os.write(2, f"error: {what}; nothing was written\n".encode())
    finally:
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job's ignored SIGINT stays so
        signal.signal(signal.SIGINT, _early)
    signal.signal(signal.SIGTERM, _early)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup stays so
        signal.signal(signal.SIGHUP, _early)
    args = list(sys.argv[1:] if argv is None else argv)
    code: Any = 0
    try:
        from inspect_model.cli.app import main as run

        run(args)
    except SystemExit as exc:
        code = exc.code
    _exit_without_finalizing(code, quiet="--quiet" in args or "-q" in args)
    sys.exit(code)


def _exit_without_finalizing(code: Any, *, quiet: bool) -> None:
    """Run the exit functions and leave with ``os._exit`` (no interpreter finalization) if
    threads the model started (non-daemon) would keep the process alive, or if this is a
    rank of a distributed run (torch.distributed loaded under torchrun); else return, and
    the normal exit follows."""
    import threading

    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    ranked = os.environ.get("WORLD_SIZE", "1") != "1" and "torch.distributed" in sys.modules
    if not left and not ranked:
        return
    names = ", ".join(repr(t.name) for t in left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    if left and not quiet:
        print(f"warning: the model left {len(left)} thread(s) running ({names}); exiting without waiting "
              "for them", file=sys.stderr)
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()  # what a normal exit runs (torch.distributed's clean-up), then no thread join
    status = code if isinstance(code, int) else (0 if code is None else 1)
    os._exit(status)
