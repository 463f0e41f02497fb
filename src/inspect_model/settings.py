"""The environment variables the tool reads, parsed in one place.

A bad value (``INSPECT_MODEL_CHECKPOINT_SECONDS=abc``) is a usage error naming the
variable and what it takes (issue 28), never a traceback or a silent default.
"""

from __future__ import annotations

import math
import os

from inspect_model.errors import UsageError


def env_float(name: str, default: float, *, low: float = 0.0, positive: bool = False) -> float:
    """``$name`` as a number >= ``low`` (> ``low`` with ``positive``), or ``default`` when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (positive and value <= low):
        bound = f"{'more than' if positive else 'at least'} {low:g}"
        raise UsageError(f"environment variable {name}={text!r} is not a number {bound}; "
                         f"fix it or unset it (default {default:g})")
    return value


def env_int(name: str, default: int, *, low: int = 0) -> int:
    """``$name`` as a whole number >= ``low``, or ``default`` when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise UsageError(f"environment variable {name}={text!r} is not a whole number of at least {low}; "
                         f"fix it or unset it (default {default})")
    return value


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """``$name`` as one of ``choices`` (case-insensitive), or ``""`` when unset or empty."""
    text = os.environ.get(name, "").strip()
    if text and text.lower() not in choices:
        raise UsageError(f"environment variable {name}={text!r} is not one of {', '.join(choices)}; "
                         "fix it or unset it")
    return text.lower()


_FLAGS = ("0", "1", "true", "false", "yes", "no", "on", "off")


def env_flag(name: str) -> bool:
    """``$name`` as a yes/no flag (1/0, true/false, yes/no, on/off); False when unset or empty."""
    return env_choice(name, _FLAGS) in ("1", "true", "yes", "on")


def check_environment() -> None:
    """Every variable the tool reads, checked at start-up (the CLI's first step), so that a
    bad value is one usage error before anything runs, whichever path would read it."""
    env_float("INSPECT_MODEL_CHECKPOINT_SECONDS", 0.0)
    env_int("INSPECT_MODEL_RENDER_THREADS", 2)
    env_float("INSPECT_MODEL_DIST_TIMEOUT", 1800.0, positive=True)
    env_choice("INSPECT_MODEL_DIST_BACKEND", ("gloo", "nccl"))
    env_flag("INSPECT_MODEL_OFFLINE")
