"""The records a measurement of layer outputs fills (``inspect-model activations``): mergeable
moments of a set of values (:class:`Moments`), the summary they give (:class:`ActivationStats`),
per-channel sums (:class:`Channels`) and what the hook keeps of one output tensor
(:class:`Measurement`). Kept apart from the reductions that fill them (measure.py, fused.py,
deferred.py), which all import these."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class Moments:
    """Mergeable statistics of a set of values; moments over the finite ones."""

    numel: int = 0
    count: int = 0  # finite values
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (finite values)
    min: float = math.inf
    max: float = -math.inf
    zeros: int = 0
    negatives: int = 0
    nan: int = 0
    inf: int = 0

    def merge(self, o: Moments) -> None:
        """Add the values of ``o`` (Chan, Golub & LeVeque's parallel update)."""
        if o.count:
            n = self.count + o.count
            delta = o.mean - self.mean
            self.mean += delta * o.count / n
            self.m2 += o.m2 + delta * delta * self.count * o.count / n
            self.count = n
        self.numel += o.numel
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)
        self.zeros += o.zeros
        self.negatives += o.negatives
        self.nan += o.nan
        self.inf += o.inf

    def stats(self) -> ActivationStats:
        nan = float("nan")
        has = self.count > 0
        return ActivationStats(
            numel=self.numel,
            mean=self.mean if has else nan,
            # Unbiased, as torch.std computes it.
            std=math.sqrt(max(self.m2, 0.0) / (self.count - 1)) if self.count > 1 else (0.0 if has else nan),
            min=self.min if has else nan,
            max=self.max if has else nan,
            zero_fraction=self.zeros / self.numel if self.numel else 0.0,
            negative_fraction=self.negatives / self.numel if self.numel else 0.0,
            nan_count=self.nan,
            inf_count=self.inf,
        )


@dataclass(frozen=True)
class ActivationStats:
    """Statistics of a layer's output: moments over finite values, fractions over all."""

    numel: int
    mean: float
    std: float
    min: float
    max: float
    zero_fraction: float  # exact zeros (dead ReLU units)
    negative_fraction: float
    nan_count: int
    inf_count: int


@dataclass
class Channels:
    """Per-channel sums over the images measured so far (tensors of shape (C,))."""

    dim: int  # channel dimension in the full output (with batch)
    sums: torch.Tensor  # float64 sum of finite values
    counts: torch.Tensor | float  # number of finite values: one number while all are finite
    dead: torch.Tensor  # bool: every value exactly zero, for every image so far

    def copy(self) -> Channels:
        counts = self.counts.clone() if not isinstance(self.counts, float) else self.counts
        return Channels(self.dim, self.sums.clone(), counts, self.dead.clone())

    def merge(self, o: Channels) -> None:
        if o.sums.shape != self.sums.shape:
            return  # a shape change between batches: keep the first
        self.sums += o.sums
        self.counts = self.counts + o.counts
        self.dead &= o.dead

    def means(self) -> list[float]:
        import torch

        counts = self.counts if isinstance(self.counts, torch.Tensor) else \
            torch.full_like(self.sums, float(self.counts))
        means = (self.sums / counts.clamp(min=1.0)).tolist()
        return [m if n > 0 else float("nan") for m, n in zip(means, counts.tolist())]


@dataclass
class Measurement:
    """What the hook keeps of one output tensor (the tensor itself is dropped)."""

    per_sample: bool  # False when dim 0 is not the batch: ``samples`` has one entry
    samples: list[Moments]
    channels: dict[int, Channels]  # by candidate channel dim
    sample_dead: dict[int, list[float]]  # dead-channel fraction of each sample, by dim
    histogram: tuple[float, float, list[float]] | None = None  # (lo, hi, counts)
    bounds: Any = None  # fused.Bounds of a few-pass measurement: what a ReLU in place after it needs

    def total(self) -> Moments:
        if len(self.samples) < 8:
            m = Moments()
            for s in self.samples:
                m.merge(s)
            return m
        import numpy as np  # many images (a GPU's batch of 64): Chan's update over all at once

        ss = self.samples
        cnt = np.array([s.count for s in ss], dtype=np.float64)
        mean = np.array([s.mean for s in ss])
        n = float(cnt.sum())
        mu = float((cnt * mean).sum() / n) if n else 0.0
        m2 = float(sum(s.m2 for s in ss) + (cnt * np.square(mean - mu)).sum()) if n else 0.0
        return Moments(numel=sum(s.numel for s in ss), count=int(n), mean=mu, m2=m2, min=min(s.min for s in ss),
                       max=max(s.max for s in ss), zeros=sum(s.zeros for s in ss),
                       negatives=sum(s.negatives for s in ss), nan=sum(s.nan for s in ss), inf=sum(s.inf for s in ss))
