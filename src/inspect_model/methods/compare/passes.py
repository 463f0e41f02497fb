"""Every batch through both sides, the per-layer sums and the outputs accumulated.

A is put in eval mode for the run and its flags restored after (also on failure); every hook
is removed by :func:`~inspect_model.methods.compare.lockstep.run_pair` before it returns.
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

    def memory(self, side: Any) -> MemoryUse:
        return MemoryUse("lockstep" if side.lockstep else "cached", self.peak, self.peak_bytes)


def run_batches(a_model: Any, side: Any, batches: Iterable[Any], call: Callable[[Any], tuple[tuple, dict]],
                pairs: dict[str, str], *, tolerance: float, low: Any) -> Passes:
    """``call(batch) -> (args, kwargs)`` of A's forward; B gets the same (moved and cast by its side)."""
    from inspect_model.methods.compare.lockstep import run_pair

    flags = [(m, m.training) for m in a_model.modules()]
    done = Passes()
    try:
        a_model.eval()
        for batch in batches:
            args, kwargs = call(batch)
            out_a, out_b, ex = run_pair(a_model, side, args, kwargs, pairs, done.sums, tolerance=tolerance, low=low,
                                        order=done.order)
            output_rows(out_a, out_b, done.outputs)
            done.peak, done.peak_bytes = max(done.peak, ex.peak), max(done.peak_bytes, ex.peak_bytes)
            done.batches += 1
    finally:
        for m, flag in flags:
            m.training = flag
        side.close()
    return done
