"""Statistics of one tensor, computed where the tensor is (inside a hook) so it can be dropped.

``tensor_stats`` is the one place that defines mean/std/min/max/zeros/negatives/NaN/Inf for
activations and gradients alike. Non-finite values are counted, and the moments are taken
over the finite values only, so one NaN does not hide the rest of the layer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorStats:
    """Summary statistics of a tensor; moments over its finite values."""

    numel: int
    mean: float
    std: float
    min: float
    max: float
    abs_mean: float
    norm: float  # L2 norm of the finite values
    zero_fraction: float
    negative_fraction: float
    nan_count: int
    inf_count: int

    @property
    def finite(self) -> bool:
        return self.nan_count == 0 and self.inf_count == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Statistics of ``t`` (any shape, any floating or integer dtype)."""
    import torch

    x = t.detach()
    if x.is_complex():
        x = x.abs()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    elif x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    numel = x.numel()
    if numel == 0:
        nan = float("nan")
        return TensorStats(0, nan, nan, nan, nan, nan, 0.0, 0.0, 0.0, 0, 0)
    x = x.reshape(-1)
    finite_mask = torch.isfinite(x)
    n_finite = int(finite_mask.sum())
    nan_count = int(torch.isnan(x).sum()) if n_finite != numel else 0
    inf_count = numel - n_finite - nan_count
    if n_finite != numel:
        x = x[finite_mask]
    if n_finite == 0:
        nan = float("nan")
        return TensorStats(numel, nan, nan, nan, nan, nan, nan, 0.0, 0.0, nan_count, inf_count)
    # One pass of reductions in float64 for sums: float32 sums lose digits over 10^7 values.
    xd = x.to(torch.float64)
    s1 = float(xd.sum())
    s2 = float((xd * xd).sum())
    mean = s1 / n_finite
    var = max(s2 / n_finite - mean * mean, 0.0)
    # Unbiased std as torch.std gives, so reports match what users compute themselves.
    std = math.sqrt(var * n_finite / (n_finite - 1)) if n_finite > 1 else 0.0
    return TensorStats(
        numel=numel,
        mean=mean,
        std=std,
        min=float(x.min()),
        max=float(x.max()),
        abs_mean=float(xd.abs().sum()) / n_finite,
        norm=math.sqrt(s2),
        zero_fraction=float((x == 0).sum()) / numel,
        negative_fraction=float((x < 0).sum()) / numel,
        nan_count=nan_count,
        inf_count=inf_count,
    )
