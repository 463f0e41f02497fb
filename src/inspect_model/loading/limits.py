"""The ranges of every count and number option, checked where they are parsed (issue 41).

One table, read by the command line, config files (the same Click parameters) and the
Python API (request dataclasses and :func:`inspect_model.run.options.check_request`): a
value outside its range is one usage error, ``--clips must be a whole number from 1 to
10,000, got 2000000000``, before anything loops over it or hands it to torch (a seed of
2^64 overflows ``torch.manual_seed``; two billion clips loop two billion times).
"""

from __future__ import annotations

import math
from typing import Any

from inspect_model.errors import UsageError

BATCH = 65_536
# option -> (lowest, highest): whole numbers unless a bound is a float.
BOUNDS: dict[str, tuple[float, float]] = {
    "--batch-size": (1, BATCH),
    # torch.manual_seed takes 64 bits, and runs derive seeds from it (seed * 1,000,003 + image):
    # 32 bits keep every derived seed in range (numpy's legacy seeds are 32 bits too).
    "--seed": (0, 2**32 - 1),
    "--frames": (1, 4096),
    "--stride": (1, 100_000),
    "--clips": (1, 10_000),
    "--resize": (1, 65_536),
    "--crop": (1, 65_536),
    "--steps": (1, 100_000),
    "--generate": (1, 4096),
    "--samples": (1, 100_000),
    "--eval-steps": (1, 100_000),
    "--eval-batch": (1, BATCH),
    "--scorecam-batch": (1, BATCH),
    "--probes": (1, 100_000),
    "--max-detections": (1, 100_000),
    "--top": (1, 100_000),
    "--top-k": (1, 1_000),
    "--max-channels": (1, 1_000_000),
    "--workers": (0, 1024),
    "--window": (1, 65_536),
    "--window-stride": (1, 65_536),
    "--max-seconds": (0.0, 1e9),  # 31 years: more is a typo, and timedelta overflows near 1e14
    "--max-memory": (0.0, 1e15),
    "--alpha": (0.0, 1.0),
    "--noise": (0.0, 1e6),
    "--tolerance": (0.0, 1e6),  # compare: relative errors (1e6: a typo, not a tolerance)
    "--fail-above": (0.0, 1e6),
}


def _show(n: float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:g}"


def check_option(flag: str, value: Any) -> Any:
    """``value`` unchanged when ``flag`` has no bounds, ``value`` is None, or it lies within
    them; a :class:`UsageError` naming the option and its range otherwise."""
    bounds = BOUNDS.get(flag)
    if bounds is None or value is None or isinstance(value, (str, bytes, tuple, list)):
        return value
    low, high = bounds
    whole = isinstance(low, int) and isinstance(high, int)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    elif whole:
        ok = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ok = ok and low <= value <= high
    else:
        ok = math.isfinite(value) and low <= value <= high
    if not ok:
        kind = "a whole number" if whole else "a number"
        raise UsageError(f"{flag} must be {kind} from {_show(low)} to {_show(high)}, got {value!r}")
    return value


def check_size(flag: str, value: int, what: str = "") -> int:
    """A size parsed from a text option (``--window 16x16``): within ``flag``'s bounds."""
    low, high = BOUNDS.get(flag, (1, 65_536))
    if not low <= value <= high:
        raise UsageError(f"{flag}{' ' + what if what else ''} must be from {_show(low)} to {_show(high)}, "
                         f"got {value:,}")
    return value


MAX_MODULE_DEPTH = 200  # real models nest a few dozen levels; torch walks them recursively (3 frames a level)


def check_module_depth(model: Any, name: str) -> None:
    """A model nested deeper than :data:`MAX_MODULE_DEPTH` modules is refused in one line
    (exit 6) before torch's recursive walks (``named_modules``, ``to``, the forward pass)
    end in a RecursionError. The walk here is iterative."""
    from inspect_model.errors import ModelRuntimeError

    todo = [(model, 1)]
    seen: set[int] = set()
    while todo:
        module, depth = todo.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        if depth > MAX_MODULE_DEPTH:
            raise ModelRuntimeError(
                f"model '{name}' nests modules more than {MAX_MODULE_DEPTH} deep (Python's recursion limit is "
                f"{__import__('sys').getrecursionlimit()} calls, and torch walks a model level by level); "
                "flatten it, e.g. an nn.Sequential of the blocks instead of each block holding the next")
        children = getattr(module, "_modules", None)
        if isinstance(children, dict):
            todo.extend((child, depth + 1) for child in children.values() if child is not None)
