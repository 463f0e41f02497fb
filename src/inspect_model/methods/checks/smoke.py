"""Smoke checks for CI: one forward and one backward pass, then PASS/FAIL per check.

``run_checks`` builds nothing and prints nothing: it takes a model and its inputs and
returns :class:`CheckResult` records. What is checked is what the caller asks for: output
shape, parameter count (exact or a range), finite outputs and gradients, dead layers,
determinism across two passes, and time and memory budgets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
from inspect_model.errors import ModelRuntimeError, UsageError
from inspect_model.methods.budget import OverBudget, time_budget

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class CheckResult:
    """One check. ``expected`` is the text the report prints ("<= 0.5", "10..20"); the JSON
    says the same in numbers (:meth:`to_dict`): ``value``, ``threshold`` (the one numeric
    bound, as ``grads`` reports it) and ``expected`` as ``{"min": .., "max": ..}`` or the exact
    value (an output shape as a list of ints, ``true``)."""

    name: str
    passed: bool
    value: Any
    expected: Any
    detail: str = ""
    unit: str = ""  # what value counts, for the text: "10 non-finite values"
    minimum: float | None = None  # numeric bounds the value must lie within (None: open)
    maximum: float | None = None
    exact: Any = None  # for equality checks: the expected value itself (JSON-able)

    def to_dict(self) -> dict[str, Any]:
        bounded = self.minimum is not None or self.maximum is not None
        threshold = self.maximum if self.maximum is not None and self.minimum is None else None
        return {"name": self.name, "status": self.status, "passed": self.passed, "value": self.value,
                "threshold": threshold,
                "expected": {"min": self.minimum, "max": self.maximum} if bounded else self.exact,
                "expected_text": str(self.expected), "detail": self.detail}

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"

    @property
    def value_text(self) -> str:
        if isinstance(self.value, list):
            return "x".join(map(str, self.value))
        if not self.unit:
            return str(self.value)
        return f"{self.value} {self.unit}" + ("" if self.value == 1 else "s")


@dataclass(frozen=True)
class LayerHealth:
    """What the check needs of each leaf layer's output, computed inside the hook."""

    zero_fraction: float
    finite: bool


def _health(t: torch.Tensor) -> LayerHealth | None:
    import torch

    if not t.is_floating_point() or t.numel() == 0:
        return None
    x = t.detach()
    return LayerHealth(float((x == 0).sum()) / x.numel(), bool(torch.isfinite(x).all()))


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.lower().replace(",", "x").split("x") if p.strip())
    except ValueError as exc:
        raise UsageError(f"--expect-output-shape '{text}' is not like 1x1000") from exc


_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def _count(text: str, whole: str) -> tuple[float, float]:
    """A count as typed: ``25557032``, ``2.5e7``, or with the suffix the tool prints (K, M,
    G; a space before it allowed): ``11.7M`` means every count that prints as 11.7M, so
    (lo, hi) is the rounding interval [11.65M, 11.75M); a plain number is exact."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise UsageError(f"--expect-params '{whole}' is not a count or a range such as 25e6..26e6 or 11.7M")
    digits, suffix = m.group(1), m.group(2).lower()
    value = float(digits) * _SUFFIXES[suffix]
    if not suffix:
        return value, value
    decimals = len(digits.split(".", 1)[1]) if "." in digits and "e" not in digits.lower() else 0
    half = 0.5 * 10.0 ** -decimals * _SUFFIXES[suffix]
    return value - half, value + half


def parse_count_range(text: str) -> tuple[int, int]:
    """``25557032`` (exact), ``25e6..26e6`` or ``25000000..`` (open-ended); the suffixes the
    tool prints are accepted: ``11.7M`` (every count that rounds to 11.7M), ``11.69 M``,
    ``25M..26M``, ``500K``, ``1.2G``."""
    raw = text.replace("_", "").replace(",", "").strip()
    if ".." in raw:
        lo_s, hi_s = raw.split("..", 1)
        # a range's ends are the numbers as typed: 11M..12M is 11,000,000..12,000,000
        lo = math.ceil(sum(_count(lo_s, text)) / 2) if lo_s.strip() else 0
        hi = math.floor(sum(_count(hi_s, text)) / 2) if hi_s.strip() else 2**63 - 1
    else:
        a, b = _count(raw, text)
        lo, hi = math.ceil(a), (math.floor(b) if a == b else math.ceil(b) - 1)  # [a, b): b itself rounds up
    if lo > hi:
        raise UsageError(f"--expect-params '{text}': the lower bound is above the upper bound")
    return lo, hi


def _zero_weights(module: Any) -> bool:
    """Whether every parameter of ``module`` itself is exactly zero (a zero-initialised layer:
    timm's ``zero_init_last`` BatchNorm, torchvision ViT's head), so a zero output is by design."""
    own = [p for p in module.parameters(recurse=False) if p.is_floating_point() and p.numel()]
    return bool(own) and all(not bool(p.detach().ne(0).any()) for p in own)


def _names(items: list[str]) -> str:
    return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")


def _dead_layers(model: Any, records: list[Any], max_dead_fraction: float) -> CheckResult:
    """Layers whose output is (almost) all zero. Not dead, and named apart: a layer whose own
    weights are exactly zero (zero-initialised on purpose: an untrained model is healthy,
    issue 29) and a layer fed only zeros (where the zeros started is listed already)."""
    modules = dict(model.named_modules())
    dead: dict[str, float] = {}  # each layer once, however often it ran (issue 14)
    zero_init: dict[str, None] = {}
    for r in records:
        for c in r.outputs:
            if c.stats is None or c.stats.zero_fraction < max_dead_fraction:
                continue
            name = r.name or "(model)"
            fed = [i.stats for i in r.inputs if i.stats is not None]
            if name in modules and _zero_weights(modules[name]):
                zero_init[name] = None
            elif fed and all(s.zero_fraction == 1.0 for s in fed):
                continue  # only zeros came in: the layer that made them is reported
            else:
                dead.setdefault(name, c.stats.zero_fraction)
    parts = [_names(list(dead))] if dead else []
    if zero_init:
        parts.append(f"{len(zero_init)} zero-initialised layer(s) not counted, their weights are exactly 0: "
                     f"{_names(list(zero_init))}")
    return CheckResult("dead layers", not dead, len(dead), f"none with zero fraction >= {max_dead_fraction:g}",
                       "; ".join(parts), maximum=0)


def _rss_mb() -> float:
    """Current resident set size in MB (Linux /proc; falls back to peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            import os

            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_checks(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    layers: Sequence[str],
    select: Any = None,
    expect_output_shape: tuple[int, ...] | None = None,
    expect_params: tuple[int, int] | None = None,
    finite: bool = True,
    max_dead_fraction: float | None = 1.0,
    deterministic: bool = False,
    max_seconds: float | None = None,
    max_memory_mb: float | None = None,
    on_stuck: Callable[[str], None] | None = None,
    mask: Any = None,
) -> list[CheckResult]:
    """Run the checks on ``model(*inputs)``; ``select`` picks the output tensor to check
    (default: the first tensor of the output). ``max_seconds`` is a timeout where the
    platform allows (:mod:`inspect_model.methods.budget`): the passes are stopped at the
    budget and the time check fails; ``on_stuck(message)`` is called if they cannot be.
    ``mask`` (B, L): a text batch's attention mask; layer health counts its real tokens only."""
    import torch

    from inspect_model.methods.objectives.targets import select_output

    pick = select or (lambda out: select_output(out, None))
    results: list[CheckResult] = []
    if expect_params is not None:
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        lo, hi = expect_params
        want = str(lo) if lo == hi else f"{lo}..{hi}"
        results.append(CheckResult("params", lo <= n <= hi, n, want, minimum=lo,
                                   maximum=hi if hi < 2**63 - 1 else None))

    rss0 = _rss_mb()
    t0 = time.perf_counter()
    # Inputs too (taken before the call, so before an in-place ReLU): a layer fed only zeros
    # is not where a dead path starts.
    from inspect_model.methods.activations.tokens import real_tokens

    health = _health if mask is None else (lambda t: _health(real_tokens(t, mask)))  # padding left out
    engine = HookEngine(model, layers, CaptureOptions(stats_fn=health, grad_enabled=True, inputs=True))
    try:
        # The budget inside the engine: its timer is off before the hooks come off.
        with engine, time_budget(max_seconds, on_stuck):
            first, second, records, grads_finite, out = _passes(model, inputs, engine, pick, deterministic)
    except OverBudget:
        assert max_seconds is not None
        seconds = time.perf_counter() - t0
        results.append(CheckResult(
            "time", False, round(seconds, 3), f"<= {max_seconds:g}",
            "the forward + backward pass did not finish: stopped at the budget, other checks not run",
            maximum=max_seconds))
        return results
    seconds = time.perf_counter() - t0
    mem = max(_peak_rss_mb(), _rss_mb()) - rss0
    _judge(results, first, second, records, grads_finite, model=model, expect_output_shape=expect_output_shape,
           finite=finite, max_dead_fraction=max_dead_fraction, deterministic=deterministic, out=out)
    if max_seconds is not None:
        results.append(CheckResult("time", seconds <= max_seconds, round(seconds, 3), f"<= {max_seconds:g}",
                                   "seconds for forward + backward", maximum=max_seconds))
    if max_memory_mb is not None:
        results.append(CheckResult("memory", mem <= max_memory_mb, round(mem, 1), f"<= {max_memory_mb:g}",
                                   "MB of peak RSS growth during the passes", maximum=max_memory_mb))
    return results


def _passes(model: Any, inputs: Sequence[Any], engine: Any, pick: Any, deterministic: bool) -> tuple[Any, ...]:
    """One forward and one backward pass (and a second forward for ``deterministic``); also
    gives the model's whole output (a detector's list of dicts is checked on its own)."""
    import torch

    out = run_forward(engine, lambda: model(*_copies(inputs)))
    y = pick(out)
    grads_finite: bool | None = None
    if y.requires_grad and y.is_floating_point():
        try:
            y.float().sum().backward()
        except Exception as exc:  # the model's own backward (custom autograd Functions)
            msg = (str(exc).strip().splitlines() or [""])[0]
            raise ModelRuntimeError(f"backward pass failed: {type(exc).__name__}: {msg}") from exc
        gs = [p.grad for p in model.parameters() if p.grad is not None]
        grads_finite = all(bool(torch.isfinite(g).all()) for g in gs)
    records = list(engine.finalize())  # the first pass only: --deterministic runs another
    first = y.detach().clone()
    second = None
    if deterministic:
        with torch.no_grad():
            second = pick(run_forward(engine, lambda: model(*_copies(inputs)))).detach().clone()
    return first, second, records, grads_finite, out


def _copies(inputs: Sequence[Any]) -> list[Any]:
    """The inputs as the model gets them: tensors copied, so that a model that changes its
    input in place (``x /= 255``) sees the same input in both passes (issue 28)."""
    import torch

    return [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]


def _judge(results: list[CheckResult], first: Any, second: Any, records: list[Any], grads_finite: bool | None,
           *, model: Any, expect_output_shape: tuple[int, ...] | None, finite: bool,
           max_dead_fraction: float | None, deterministic: bool, out: Any = None) -> None:
    import torch

    if expect_output_shape is not None:
        shape = tuple(first.shape)
        results.append(CheckResult("output shape", shape == tuple(expect_output_shape),
                                   list(shape), "x".join(map(str, expect_output_shape)),
                                   exact=list(expect_output_shape)))
    if finite:
        n_bad = int((~torch.isfinite(first.float())).sum()) if first.is_floating_point() else 0
        bad_layers = [r.key for r in records for c in r.outputs if c.stats is not None and not c.stats.finite]
        detail = f"first non-finite layer: {bad_layers[0]}" if bad_layers else ""
        results.append(CheckResult("finite outputs", n_bad == 0, n_bad, 0, detail, unit="non-finite value",
                                   maximum=0))
        if grads_finite is not None:
            results.append(CheckResult("finite gradients", grads_finite, grads_finite, True, exact=True))
        from inspect_model.methods.checks.detection import detection_output_check

        det = detection_output_check(out)  # a detector's list of dicts, every image (issue 24)
        if det is not None:
            passed, problems, detail = det
            results.append(CheckResult("detection outputs", passed, problems, 0, detail, unit="problem"))
    if max_dead_fraction is not None:
        results.append(_dead_layers(model, records, max_dead_fraction))
    if deterministic and second is not None:
        same = first.shape == second.shape and bool(torch.equal(first, second))
        diff = 0.0 if same or first.shape != second.shape else float((first.float() - second.float()).abs().max())
        results.append(CheckResult("deterministic", same, diff if not math.isnan(diff) else None, 0.0,
                                   "max |difference| between two passes", maximum=0.0))
