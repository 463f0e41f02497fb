"""Every batch through both sides, the per-layer sums and the outputs accumulated.

A is put in eval mode for the run and its flags restored after (also on failure); every hook
is removed by :func:`~inspect_model.methods.compare.exchange.run_pair` before it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from inspect_model.methods.compare.report import MemoryUse, output_rows
from inspect_model.methods.compare.stats import PairSums


@dataclass
class Passes:
    """What the batches gave: per-layer sums, A's call order, output sums, memory held."""

    sums: dict[str, PairSums] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    peak: int = 0
    peak_bytes: int = 0
    batches: int = 0
    budget: int | None = None  # bytes B may hold ahead of A (None: a cached side, no limit)

    def memory(self, side: Any) -> MemoryUse:
        return MemoryUse("ahead" if side.streamed else "cached", self.peak, self.peak_bytes, self.budget)


def run_batches(a_model: Any, side: Any, batches: Iterable[Any], call: Callable[[Any], tuple[tuple, dict]],
                pairs: dict[str, str], *, tolerance: float, low: Any, budget: int | None = None) -> Passes:
    """``call(batch) -> (args, kwargs)`` of A's forward; B gets the same (moved and cast by its side);
    ``budget``: bytes of B's outputs held ahead of A (None: ``exchange.default_budget()``)."""
    from inspect_model.methods.compare.buffers import BUFFERS
    from inspect_model.methods.compare.exchange import default_budget, run_pair

    flags = [(m, m.training) for m in a_model.modules()]
    done = Passes(budget=(budget or default_budget()) if side.streamed else None)
    BUFFERS.start(done.budget or 0)
    try:
        if any(flag for _, flag in flags):  # already in eval mode (the usual case): no call per module
            a_model.eval()
        for batch in batches:
            args, kwargs = call(batch)
            out_a, out_b, ex = run_pair(a_model, side, args, kwargs, pairs, done.sums, tolerance=tolerance, low=low,
                                        order=done.order, budget=done.budget)
            output_rows(out_a, out_b, done.outputs)
            done.peak, done.peak_bytes = max(done.peak, ex.peak), max(done.peak_bytes, ex.peak_bytes)
            done.batches += 1
    finally:
        for m, flag in flags:
            if m.training != flag:  # Module.__setattr__ is slow: only the flags that changed
                m.training = flag
        side.close()
        BUFFERS.idle()
    return done
