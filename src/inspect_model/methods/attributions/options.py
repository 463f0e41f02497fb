"""The ``attributions`` options, without torch: :class:`AttributionSettings` (how to
attribute: the request's option group, parsed once as ``request.attribution``) and its checks:
method names (from the registry, :mod:`.base`), integration rules, noise modes, baselines and
window sizes, so that a bad option fails before torch is imported.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

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


RUN_FIELDS = ("batch_size", "seed")  # set by the run (its input plan), not by the request


@dataclass(frozen=True, eq=False)
class AttributionSettings:
    """How to attribute; validated once, here. ``window``/``stride`` may leave out leading
    (image channel) or trailing (embedding) dimensions, see ``passes.window_shape``."""

    methods: tuple[str, ...] = ("saliency",)
    steps: int | str = 32  # or "auto": per map, the fewest that meet max_gap (attribution_options.AUTO_*)
    rule: str = "gauss-legendre"  # captum's default
    baseline: Any = "zeros"  # zeros | blur | blur:SIGMA | uniform | number | file | tensor
    samples: int = 16
    noise: float = 0.15  # SmoothGrad's 10-20 % of the input range
    noise_mode: str = "fraction"
    window: tuple[int, ...] = (16,)
    stride: tuple[int, ...] | None = None  # default: half the window
    smooth: bool = False
    batch_size: int = 32
    seed: int = 0
    activations: bool = False  # guided: guide relu6/leaky_relu/silu/gelu/prelu too
    max_gap: float = 1e-3  # steps="auto": the largest |gap| / |f(x) - f(baseline)| accepted

    attr: ClassVar[str] = "attribution"  # the attributions request's option group: request.attribution

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", parse_methods(self.methods))
        object.__setattr__(self, "steps", parse_steps(self.steps))
        check_settings(steps=self.steps, rule=self.rule, samples=self.samples, noise=self.noise,
                       noise_mode=self.noise_mode, batch_size=self.batch_size, smooth=self.smooth,
                       methods=self.methods, max_gap=self.max_gap)
        object.__setattr__(self, "baseline", parse_baseline(self.baseline))
        object.__setattr__(self, "window", parse_sizes(self.window, "--window"))
        object.__setattr__(self, "stride", parse_sizes(self.stride, "--window-stride"))

    @classmethod
    def parse(cls, request: Any) -> AttributionSettings:
        """The settings of an ``attributions`` request (fields of the same names; the run's
        batch size and seed come later, :meth:`for_run`)."""
        given = {f.name: getattr(request, f.name) for f in dataclasses.fields(cls) if f.name not in RUN_FIELDS}
        return cls(**{**given, "methods": given["methods"] or ("saliency",)})

    def for_run(self, *, batch_size: int, seed: int) -> AttributionSettings:
        """These settings with a run's batch size and seed; the rest stays as parsed once."""
        if batch_size < 1:
            raise UsageError(f"--batch-size {batch_size}: give 1 or more rows per pass")
        out = copy.copy(self)
        object.__setattr__(out, "batch_size", batch_size)
        object.__setattr__(out, "seed", seed)
        return out

    @property
    def guided_kinds(self) -> tuple[str, ...]:
        from inspect_model.methods.guided.backprop import resolve_kinds

        return resolve_kinds(self.activations)

    @property
    def smoothed(self) -> tuple[str, ...]:
        from inspect_model.methods.attributions import base

        return tuple(m for m in self.methods if self.smooth and base.get(m).smoothable)
