"""The ``attributions`` report's entries, as typed records (:mod:`inspect_model.reports.attributions`):
one :class:`AttributionMap` per (method, target) map of an image, and the image's entry.
The session builds these; render/ only formats them (issue 35)."""

from __future__ import annotations

from typing import Any

from inspect_model.reports.attributions import AttributionMap, AttributionsImage, AttributionTarget, TextTokens
from inspect_model.reports.base import ABSENT


def map_entry(method: str, stats: dict[str, float], *, signed: bool, smoothed: bool, target: AttributionTarget,
              rank: int, layer: str, baseline_score: float | None = None, delta: float | None = None,
              steps: int | None = None, gap_tolerance: float | None = None,
              tokens: list[float] | None = None) -> AttributionMap:
    """One map's entry: what it is, its statistics, and for integrated gradients f(x),
    f(baseline), the completeness gap sum(map) - (f(x) - f(baseline)) and the steps it took."""
    ig: dict[str, Any] = {}
    if delta is not None:
        score = target.score
        ig = {"baseline_score": baseline_score, "completeness_gap": delta,
              "relative_gap": (abs(delta) / abs(score - baseline_score)
                               if baseline_score is not None and score is not None and score != baseline_score
                               else None)}
    return AttributionMap(
        method=method, smoothed=smoothed, signed=signed, target=target,
        positive_mass=stats["positive"], negative_mass=stats["negative"], sum=stats["sum"],
        abs_mass=stats["abs"], max_abs=stats["max_abs"], rank=rank, layer=layer, files={},
        steps=ABSENT if steps is None else steps,
        gap_tolerance=ABSENT if gap_tolerance is None else gap_tolerance,
        tokens=ABSENT if tokens is None else tokens, **ig)


def image_entry(*, index: int, name: str, size: list[int] | None, targets: list[int],
                maps: list[AttributionMap], token_ids: list[int] | None = None,
                text: TextTokens | None = None) -> AttributionsImage:
    """An image's entry: its targets and maps (``token_ids``/``text`` for a text input)."""
    return AttributionsImage(index=index, image=name, size=size, targets=targets, maps=maps, files={},
                             token_ids=ABSENT if token_ids is None else token_ids,
                             text=ABSENT if text is None else text)
