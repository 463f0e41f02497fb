"""Smoke checks for CI: one forward and one backward pass, then PASS/FAIL per check.

``run_checks`` builds nothing and prints nothing: it takes a model and its inputs and
returns :class:`CheckResult` records. What is checked is what the caller asks for: output
shape, parameter count (exact or a range), finite outputs and gradients, dead layers,
determinism across two passes, and time and memory budgets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
from inspect_model.errors import ModelRuntimeError, UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    value: Any
    expected: Any
    detail: str = ""
    unit: str = ""  # what value counts, for the text: "10 non-finite values"

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"

    @property
    def value_text(self) -> str:
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


def parse_count_range(text: str) -> tuple[int, int]:
    """``25557032`` (exact), ``25e6..26e6`` or ``25000000..`` (open-ended)."""
    raw = text.replace("_", "").replace(",", "").strip()
    try:
        if ".." in raw:
            lo_s, hi_s = raw.split("..", 1)
            lo = int(float(lo_s)) if lo_s else 0
            hi = int(float(hi_s)) if hi_s else 2**63 - 1
        else:
            lo = hi = int(float(raw))
    except ValueError as exc:
        raise UsageError(f"--expect-params '{text}' is not a count or a range such as 25e6..26e6") from exc
    if lo > hi:
        raise UsageError(f"--expect-params '{text}': the lower bound is above the upper bound")
    return lo, hi


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
) -> list[CheckResult]:
    """Run the checks on ``model(*inputs)``; ``select`` picks the output tensor to check
    (default: the first tensor of the output)."""
    import torch

    from inspect_model.methods.targets import select_output

    pick = select or (lambda out: select_output(out, None))
    results: list[CheckResult] = []
    if expect_params is not None:
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        lo, hi = expect_params
        want = str(lo) if lo == hi else f"{lo}..{hi}"
        results.append(CheckResult("params", lo <= n <= hi, n, want))

    rss0 = _rss_mb()
    t0 = time.perf_counter()
    engine = HookEngine(model, layers, CaptureOptions(stats_fn=_health, grad_enabled=True))
    with engine:
        out = run_forward(engine, lambda: model(*inputs))
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
                second = pick(run_forward(engine, lambda: model(*inputs))).detach().clone()
    seconds = time.perf_counter() - t0
    mem = max(_peak_rss_mb(), _rss_mb()) - rss0

    if expect_output_shape is not None:
        shape = tuple(first.shape)
        results.append(CheckResult("output shape", shape == tuple(expect_output_shape),
                                   "x".join(map(str, shape)), "x".join(map(str, expect_output_shape))))
    if finite:
        n_bad = int((~torch.isfinite(first.float())).sum()) if first.is_floating_point() else 0
        bad_layers = [r.key for r in records for c in r.outputs if c.stats is not None and not c.stats.finite]
        detail = f"first non-finite layer: {bad_layers[0]}" if bad_layers else ""
        results.append(CheckResult("finite outputs", n_bad == 0, n_bad, 0, detail, unit="non-finite value"))
        if grads_finite is not None:
            results.append(CheckResult("finite gradients", grads_finite, grads_finite, True))
        from inspect_model.methods.dense_checks import detection_output_check

        det = detection_output_check(out)  # a detector's list of dicts, every image (issue 24)
        if det is not None:
            results.append(det)
    if max_dead_fraction is not None:
        dead_by_layer: dict[str, float] = {}  # each layer once, however often it ran (issue 14)
        for r in records:
            for c in r.outputs:
                if c.stats is not None and c.stats.zero_fraction >= max_dead_fraction:
                    dead_by_layer.setdefault(r.name or "(model)", c.stats.zero_fraction)
        dead = list(dead_by_layer.items())
        names = ", ".join(k for k, _ in dead[:5]) + (f" (+{len(dead) - 5} more)" if len(dead) > 5 else "")
        results.append(CheckResult("dead layers", not dead, len(dead), f"none with zero fraction >= {max_dead_fraction:g}",
                                   names))
    if deterministic and second is not None:
        same = first.shape == second.shape and bool(torch.equal(first, second))
        diff = 0.0 if same or first.shape != second.shape else float((first.float() - second.float()).abs().max())
        results.append(CheckResult("deterministic", same, diff if not math.isnan(diff) else None, 0.0,
                                   "max |difference| between two passes"))
    if max_seconds is not None:
        results.append(CheckResult("time", seconds <= max_seconds, round(seconds, 3), f"<= {max_seconds:g}",
                                   "seconds for forward + backward"))
    if max_memory_mb is not None:
        results.append(CheckResult("memory", mem <= max_memory_mb, round(mem, 1), f"<= {max_memory_mb:g}",
                                   "MB of peak RSS growth during the passes"))
    return results
