"""The checks of the ``attributions`` options, without torch: method names (from the
registry, :mod:`.base`), integration rules, noise modes, baselines and window sizes. The request (api/) and
:class:`methods.attributions.AttributionSettings` both validate through here, so that a bad
option fails before torch is imported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inspect_model.errors import UsageError, suggest

RULES = ("riemann-left", "riemann-right", "riemann-middle", "riemann-trapezoid", "gauss-legendre")
NOISE_MODES = ("fraction", "absolute")


def parse_methods(methods: str | Sequence[str]) -> tuple[str, ...]:
    """``"saliency,integrated-gradients"``, a list (items may hold commas), or ``all``:
    known names (the family's registry, :mod:`.base`), in its order, each once."""
    from inspect_model.methods.attributions import base

    known = base.names()
    items = [methods] if isinstance(methods, str) else list(methods)
    names = [n.strip().lower() for item in items for n in str(item).split(",") if n.strip()]
    if "all" in names:
        return known
    aliases = base.aliases()
    names = [aliases.get(n, n) for n in names]
    for n in names:
        if n not in known:
            raise UsageError(f"--method '{n}' is not an attribution method; methods: {', '.join(known)}, all"
                             + suggest(n, list(known)))
    if not names:
        raise UsageError("--method names no method; give one or more of " + ", ".join(known))
    return tuple(m for m in known if m in names)


def parse_baseline(spec: Any) -> Any:
    """A baseline given as ``zeros``, ``blur``, ``blur:SIGMA``, ``uniform``, a number or a
    ``.pt``/``.npy`` file path, normalised (a tensor passes through unchanged)."""
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):  # a tensor or an array
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if not math.isfinite(spec):
            raise UsageError(f"--baseline {spec}: give a finite number")
        return float(spec)
    text = str(spec).strip()
    if text in ("zeros", "zero", "0"):
        return "zeros"
    if text in ("uniform", "blur"):
        return text
    if text.startswith("blur:"):
        try:
            sigma = float(text[5:])
        except ValueError as exc:
            raise UsageError(f"--baseline '{text}': blur:SIGMA needs a number of pixels") from exc
        if not sigma > 0 or not math.isfinite(sigma):
            raise UsageError(f"--baseline '{text}': the blur sigma must be a positive number of pixels")
        return text
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return parse_baseline(value)
    path = Path(text)
    if not path.is_file():
        raise UsageError(f"--baseline '{text}' is not zeros, blur, blur:SIGMA, uniform, a number or an existing "
                         ".pt/.npy file")
    return path


def parse_sizes(value: Any, flag: str) -> tuple[int, ...] | None:
    """``"16"``, ``"3,16,16"``, ``"16x16"``, an int or a sequence: a tuple of sizes >= 1."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = value.replace("x", ",").split(",")
    else:
        items = list(value)
    try:
        sizes = tuple(int(str(v).strip()) for v in items if str(v).strip())
    except ValueError as exc:
        raise UsageError(f"{flag} '{value}' must be sizes such as 16, 16,16 or 3,16,16") from exc
    if not sizes or any(v < 1 for v in sizes):
        raise UsageError(f"{flag} '{value}': sizes must be 1 or more")
    if len(sizes) > 8:
        raise UsageError(f"{flag} '{value}' has {len(sizes)} sizes; a window has at most one per input dimension")
    from inspect_model.loading.limits import check_size

    for v in sizes:
        check_size(flag, v)  # the same range as every other size option (issue 41)
    return sizes


# --steps auto (issue 40): Gauss-Legendre steps doubling from AUTO_FIRST, per map, until its
# completeness gap is at most --max-gap of |f(x) - f(baseline)|; at most AUTO_CAP steps.
AUTO_FIRST, AUTO_CAP = 4, 256


def parse_steps(steps: int | str) -> int | str:
    """``--steps``: a count of 1 or more, or ``auto``."""
    if isinstance(steps, str):
        text = steps.strip().lower()
        if text == "auto":
            return "auto"
        try:
            steps = int(text)
        except ValueError:
            raise UsageError(f"--steps '{steps}': give a number of steps (32) or auto") from None
    return steps


def check_settings(*, steps: int | str, rule: str, samples: int, noise: float, noise_mode: str, batch_size: int,
                   smooth: bool, methods: Sequence[str], max_gap: float = 1e-3) -> None:
    """The numeric and named options (UsageError naming the option)."""
    steps = parse_steps(steps)
    if steps == "auto":
        if not (max_gap > 0 and math.isfinite(max_gap)):
            raise UsageError(f"--max-gap {max_gap}: give a relative completeness gap above 0 (0.001 is 0.1 %)")
        if smooth and "integrated-gradients" in methods:
            raise UsageError("--steps auto judges each map by its completeness gap, which noise samples blur; "
                             "give a number of steps with --smooth")
        steps = AUTO_CAP
    assert isinstance(steps, int)
    if steps < 1:
        raise UsageError(f"--steps {steps}: integrated gradients needs at least 1 step")
    if rule not in RULES:
        raise UsageError(f"--rule '{rule}' is not one of {', '.join(RULES)}" + suggest(rule, list(RULES)))
    if rule == "riemann-trapezoid" and steps < 2:
        raise UsageError("--steps 1: the trapezoid rule needs at least 2 steps (both ends)")
    if samples < 1:
        raise UsageError(f"--samples {samples}: SmoothGrad needs at least 1 noise sample")
    if noise_mode not in NOISE_MODES:
        raise UsageError(f"--noise-mode '{noise_mode}' is not one of {', '.join(NOISE_MODES)}")
    if not (noise >= 0 and math.isfinite(noise)):
        raise UsageError(f"--noise {noise}: give a level of 0 or more (a fraction of the input range)")
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: give 1 or more rows per pass")
    from inspect_model.methods.attributions import base

    smoothable = [n for n, m in base.methods().items() if m.smoothable]
    if smooth and not any(m in smoothable for m in methods):
        raise UsageError("--smooth applies to " + ", ".join(smoothable) + "; none of them is selected")
