"""The exception hierarchy of inspect-model and the exit code each error maps to.

Every error the user can cause is an :class:`InspectModelError` subclass; the CLI edge
(``cli/app.py``) prints ``error: <message>`` on stderr and exits with ``exit_code``.
Messages name the bad value and, where there is one, the fix.
"""

from __future__ import annotations

# Exit codes are part of the interface (README "Exit codes"); never renumber them.
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_MODEL_LOAD = 3
EXIT_INPUT = 4
EXIT_LAYER = 5
EXIT_RUNTIME = 6
EXIT_OUTPUT = 7
EXIT_DISTRIBUTED = 8
EXIT_UNSUPPORTED = 9
EXIT_HANGUP = 129  # 128 + SIGHUP: the terminal closed
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_CHECK_FAILED: "a check failed (--fail-on, check)",
    EXIT_USAGE: "usage error: bad option, argument or config file",
    EXIT_MODEL_LOAD: "the model or its weights/checkpoint could not be loaded",
    EXIT_INPUT: "an input (image, input size, labels) is invalid",
    EXIT_LAYER: "the layer selection is invalid or selects nothing",
    EXIT_RUNTIME: "the model failed while running (forward/backward pass)",
    EXIT_OUTPUT: "an output file or directory could not be written",
    EXIT_DISTRIBUTED: "a run under torchrun failed: rendezvous, or another rank failed",
    EXIT_UNSUPPORTED: "the command does not apply to this kind of model (its task)",
    EXIT_HANGUP: "hung up (SIGHUP: the terminal or session closed)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_TERMINATED: "terminated (SIGTERM)",
}


class InspectModelError(Exception):
    """Base class: a problem the user can fix; ``str(exc)`` is a one-line message."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str) -> None:
        # Keep messages one line: the CLI prints them as `error: ...`.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class UsageError(InspectModelError):
    """A bad option value or config file."""

    exit_code = EXIT_USAGE


class ModelLoadError(InspectModelError):
    """The model, its weights or its checkpoint could not be loaded."""

    exit_code = EXIT_MODEL_LOAD


class InputError(InspectModelError):
    """An image, an input size, a label file or a target is invalid."""

    exit_code = EXIT_INPUT


class LayerSelectionError(InspectModelError):
    """A layer spec names no layer or selects nothing."""

    exit_code = EXIT_LAYER


class ModelRuntimeError(InspectModelError):
    """The model raised (or produced something unusable) during forward or backward."""

    exit_code = EXIT_RUNTIME


class InputMismatchError(InputError, ModelRuntimeError):
    """The forward pass failed in the model's first layer: the input's shape (or channel
    count) does not fit the model. An input error (exit 4) that is also a runtime error,
    for callers that catch :class:`ModelRuntimeError` around a forward pass."""

    exit_code = EXIT_INPUT


class OutputError(InspectModelError):
    """An output directory or file cannot be written."""

    exit_code = EXIT_OUTPUT


class DistributedError(InspectModelError):
    """A run under torchrun failed as a whole: rendezvous, mismatched ranks, or another rank's error."""

    exit_code = EXIT_DISTRIBUTED


class UnsupportedModelError(InspectModelError):
    """The command (or objective) does not apply to the model's task: an encoder-decoder's
    attention, a detector's attributions (issue 42). The message names a command that works."""

    exit_code = EXIT_UNSUPPORTED


class CheckFailed(InspectModelError):
    """A requested check (``--fail-on``, ``check``) failed."""

    exit_code = EXIT_CHECK_FAILED


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) arrived: unwinds the run like Ctrl-C does (outputs cleaned up),
    then exit 143 (129 for SIGHUP). A BaseException, so that no ``except Exception`` in the
    way swallows it."""

    def __init__(self, signum: int = 15) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def hangup(self) -> bool:
        return self.signum == 1


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) in the CLI: like KeyboardInterrupt, but not turned into a silent exit
    130 by Typer, so that the edge can say what happened."""


ONE_LINE_MAX = 200  # characters of an exception's text in a one-line message


def one_line(exc: BaseException | str, limit: int = ONE_LINE_MAX) -> str:
    """An exception (or a text) as one line: its first non-empty line, spaces collapsed, cut
    at ``limit`` characters (``...`` says so); the exception's type when it has no text.
    The one way an exception becomes part of a message (C++ errors add stack frames on
    later lines)."""
    text = exc if isinstance(exc, str) else str(exc)
    first = " ".join(next((ln for ln in text.splitlines() if ln.strip()), "").split())
    if not first:
        return "" if isinstance(exc, str) else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def out_of_memory(exc: BaseException, where: str = "") -> str | None:
    """The one-line message for an allocation that failed (``MemoryError``, torch's CPU
    allocator's RuntimeError "DefaultCPUAllocator: not enough memory: you tried to allocate
    N bytes" or "... can't allocate memory: you tried to allocate N bytes", CUDA's ``OutOfMemoryError``), saying how much was asked for (and ``where``:
    " in the forward pass"); None otherwise."""
    import re

    text = str(exc)
    cuda = type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in text
    # The CPU allocator words it two ways: "not enough memory: you tried to allocate N bytes"
    # and "can't allocate memory: you tried to allocate N bytes" (issue 41); MPS and XPU alike.
    low = text.lower()
    cpu = ("you tried to allocate" in low or "defaultcpuallocator" in low) and any(
        w in low for w in ("not enough memory", "can't allocate memory", "cannot allocate memory", "out of memory"))
    if not (isinstance(exc, MemoryError) or cuda or cpu):
        return None
    device = "GPU" if cuda else "CPU"
    asked = ""
    m = re.search(r"allocate (\d+) bytes", text)
    if m:
        asked = f" (an allocation of {_size(int(m.group(1)))} failed)"
    else:
        m = re.search(r"allocate ([\d.]+ [KMGT]?i?B)", text)
        if m:
            asked = f" (an allocation of {m.group(1)} failed)"
    return (f"out of {device} memory{asked}{where}; use a smaller --batch-size or --input-size, "
            "or fewer/smaller images")


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


def suggest(name: str, candidates: list[str] | tuple[str, ...], n: int = 3) -> str:
    """Return ``"; did you mean 'a', 'b'?"`` for the closest candidates, or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)
    if not close:
        low = name.lower()
        close = [c for c in candidates if low and low in c.lower()][:n]
    if not close:
        return ""
    return "; did you mean " + ", ".join(repr(c) for c in close) + "?"
