"""The numbers of the cascading-randomisation sanity check (Adebayo et al. 2018), shared by
``guided-backprop --sanity`` and ``attributions --sanity``: per-map Spearman correlations
gathered over batches and ranks (:func:`extend`), then averaged per step with the NaNs of
constant maps left out (:func:`add_means`). Nothing here imports torch."""

from __future__ import annotations

import math
from typing import Any

METHOD = "cascading randomisation from the top (Adebayo et al. 2018)"


def extend(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Append ``src``'s correlations (``spearman``, ``spearman_abs``) to ``dst``'s."""
    dst["spearman"].extend(src["spearman"])
    dst["spearman_abs"].extend(src["spearman_abs"])


def nan_mean(values: list[float]) -> float | None:
    """The mean of the values that are not NaN (None when none is)."""
    ok = [x for x in values if not math.isnan(x)]
    return sum(ok) / len(ok) if ok else None


def add_means(vals: dict[str, Any]) -> None:
    """``spearman_mean`` and ``spearman_abs_mean`` beside the correlations."""
    vals["spearman_mean"] = nan_mean(vals["spearman"])
    vals["spearman_abs_mean"] = nan_mean(vals["spearman_abs"])
