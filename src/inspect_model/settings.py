"""The environment variables the tool reads, parsed in one place.

A bad value (``INSPECT_MODEL_CHECKPOINT_SECONDS=abc``) is a usage error naming the
variable and what it takes (issue 28), never a traceback or a silent default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from inspect_model.errors import UsageError


SECONDS_MAX = 1e9  # 31 years: more is a typo, and timedelta overflows near 1e14 (a timeout of 1e308)
COUNT_MAX = 1 << 20


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def env_float(name: str, default: float, *, low: float = 0.0, positive: bool = False,
              high: float = SECONDS_MAX) -> float:
    """``$name`` as a number in [``low``, ``high``] (> ``low`` with ``positive``), or
    ``default`` when unset or empty."""
    text = _raw(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (positive and value <= low) or value > high:
        bound = f"{'more than' if positive else 'at least'} {low:g} and at most {high:g}"
        raise UsageError(f"environment variable {name}={text!r} is not a number {bound}; "
                         f"fix it or unset it (default {default:g})")
    return value


def env_int(name: str, default: int, *, low: int = 0, high: int = COUNT_MAX) -> int:
    """``$name`` as a whole number in [``low``, ``high``], or ``default`` when unset or empty."""
    text = _raw(name)
    if not text:
        return default
    try:
        value = int(text) if len(text) <= 30 else low - 1
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise UsageError(f"environment variable {name}={text!r} is not a whole number from {low} to {high:,}; "
                         f"fix it or unset it (default {default})")
    return value


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """``$name`` as one of ``choices`` (case-insensitive), or ``""`` when unset or empty."""
    text = _raw(name)
    if text and text.lower() not in choices:
        raise UsageError(f"environment variable {name}={text!r} is not one of {', '.join(choices)}; "
                         "fix it or unset it")
    return text.lower()


_FLAGS = ("0", "1", "true", "false", "yes", "no", "on", "off")
_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str, *, strict: bool = True) -> bool:
    """``$name`` as a yes/no flag (1/0, true/false, yes/no, on/off, any case); False when
    unset or empty. Another value is a usage error, or with ``strict=False`` (a variable of
    another tool's, HF_HUB_OFFLINE: read as that tool reads it) False."""
    if not strict:
        return _raw(name).lower() in _TRUE
    return env_choice(name, _FLAGS) in _TRUE


# Every variable the tool reads, with its reader: check_environment() reads them all.
VARIABLES: dict[str, Callable[[], object]] = {
    "INSPECT_MODEL_CHECKPOINT_SECONDS": lambda: env_float("INSPECT_MODEL_CHECKPOINT_SECONDS", 0.0),
    "INSPECT_MODEL_PROGRESS_SECONDS": lambda: env_float("INSPECT_MODEL_PROGRESS_SECONDS", 30.0, positive=True),
    "INSPECT_MODEL_RENDER_THREADS": lambda: env_int("INSPECT_MODEL_RENDER_THREADS", 2, high=256),
    "INSPECT_MODEL_DIST_TIMEOUT": lambda: env_float("INSPECT_MODEL_DIST_TIMEOUT", 1800.0, positive=True),
    "INSPECT_MODEL_DIST_BACKEND": lambda: env_choice("INSPECT_MODEL_DIST_BACKEND", ("gloo", "nccl")),
    "INSPECT_MODEL_OFFLINE": lambda: env_flag("INSPECT_MODEL_OFFLINE"),
}


def read(name: str) -> object:
    """The value of one of :data:`VARIABLES`, through its typed reader."""
    return VARIABLES[name]()


def check_environment() -> None:
    """Every variable the tool reads, checked at start-up (the CLI's first step), so that a
    bad value is one usage error before anything runs, whichever path would read it."""
    for reader in VARIABLES.values():
        reader()
