"""Faithfulness of a saliency map: does the model's confidence depend on the pixels the map
ranks highest? Pure functions, tensors in, numbers (or perturbed inputs) out; the model
passes that score the perturbed inputs live in :mod:`.passes`.

- Deletion and insertion (Petsiuk et al. 2018, RISE): pixels are removed (set to 0 in the
  model's input space, i.e. the normalisation mean) or inserted (into a Gaussian-blurred copy,
  kernel 11, sigma 5) in the order the map gives, in ``steps`` equal steps; the score is the
  area under the target-probability curve over the fraction changed (trapezoid rule on
  [0, 1]). Lower deletion and higher insertion are better.
- ROAD (Rong et al. 2022): the most relevant (MoRF) or least relevant (LeRF) fraction of
  the pixels is removed and filled by noisy linear imputation: each removed pixel is the
  weighted mean of its 8 neighbours (1/6 edge, 1/12 corner), solved as one sparse linear
  system per channel (multigrid-preconditioned conjugate gradients, all masks and channels
  of an image in one batch: :mod:`.impute`), plus N(0, 0.01^2) noise. Lower MoRF and
  higher LeRF are better; ``road`` = mean(LeRF - MoRF) / 2 as pytorch-grad-cam's ROADCombined.
- Average drop and increase in confidence (Chattopadhyay et al. 2018): the input times the
  map; drop = max(0, Y - O) / Y in percent, increase = 100 when O > Y else 0 (averaged, the
  percentage of images).
- Pointing game (Zhang et al. 2018) and energy game (Wang et al. 2020, Score-CAM): whether
  the map's maximum (the centroid of its maxima when tied) falls in a box, and the share of
  the map's mass inside the boxes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError
from inspect_model.methods.faithfulness.impute import impute  # noqa: F401  (ROAD's imputation, re-exported)

if TYPE_CHECKING:
    import torch

METRICS = ("deletion", "insertion", "road", "confidence", "pointing", "energy")
BOX_METRICS = ("pointing", "energy")
ROAD_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # Rong et al. 2022, Fig. 4
ROAD_NOISE = 0.01  # std of the imputation noise, as the authors' code
BLUR_KERNEL, BLUR_SIGMA = 11, 5.0  # RISE's insertion substrate
# What each score means: True when higher is better. The rank uses the ones marked ranked.
SCORES: dict[str, tuple[str, bool, bool]] = {  # key -> (metric, higher is better, ranked)
    "deletion": ("deletion", False, True),
    "insertion": ("insertion", True, True),
    "road_morf": ("road", False, False),
    "road_lerf": ("road", True, False),
    "road": ("road", True, True),
    "drop": ("confidence", False, True),
    "increase": ("confidence", True, True),
    "pointing": ("pointing", True, True),
    "energy": ("energy", True, True),
}


def parse_metrics(items: Sequence[str] | None, *, boxes: bool) -> list[str]:
    """``--metric`` values (repeatable, comma lists; default all that apply) in a fixed order."""
    wanted: list[str] = []
    for item in items or ["all"]:
        for raw in item.split(","):
            m = raw.strip().lower()
            if not m:
                continue
            if m == "all":
                wanted += [x for x in METRICS if boxes or x not in BOX_METRICS]
            elif m in METRICS:
                wanted.append(m)
            else:
                from inspect_model.errors import suggest

                raise UsageError(f"--metric '{raw.strip()}' is not a faithfulness metric"
                                 + (suggest(m, list(METRICS)) or "") + f"; choose from {', '.join(METRICS)}, all")
    for m in wanted:
        if m in BOX_METRICS and not boxes:
            raise UsageError(f"--metric {m} needs boxes; give --boxes FILE")
    return [m for m in METRICS if m in wanted]


# ----------------------------------------------------------------------------- orders and masks
def pixel_order(saliency: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flat pixel indices (H*W,), most relevant first. Ties are broken by a random
    permutation from ``generator`` (a constant map is then a random order), else in raster
    order."""
    import torch

    flat = saliency.detach().reshape(-1).float().cpu()
    if generator is None:
        return torch.argsort(-flat, stable=True)
    perm = torch.randperm(flat.numel(), generator=generator)
    return perm[torch.argsort(-flat[perm], stable=True)]


def step_counts(n_pixels: int, steps: int) -> list[int]:
    """How many pixels are changed at each of the ``steps + 1`` points of a curve."""
    return [round(k * n_pixels / steps) for k in range(steps + 1)]


def gaussian_blur(x: torch.Tensor, kernel: int = BLUR_KERNEL, sigma: float = BLUR_SIGMA) -> torch.Tensor:
    """Separable Gaussian blur of (N, C, H, W) with replicated borders."""
    import torch
    import torch.nn.functional as F

    r = kernel // 2
    t = torch.arange(kernel, dtype=torch.float64) - r
    g = torch.exp(-(t * t) / (2 * sigma * sigma))
    g = (g / g.sum()).to(x.dtype).to(x.device)
    n, c, h, w = x.shape
    y = x.reshape(n * c, 1, h, w)
    y = F.conv2d(F.pad(y, (r, r, 0, 0), mode="replicate"), g.reshape(1, 1, 1, kernel))
    y = F.conv2d(F.pad(y, (0, 0, r, r), mode="replicate"), g.reshape(1, 1, kernel, 1))
    return y.reshape(n, c, h, w)


def causal_inputs(start: torch.Tensor, finish: torch.Tensor, order: torch.Tensor,
                  counts: Sequence[int]) -> torch.Tensor:
    """Input k is ``start`` with its first ``counts[k]`` pixels of ``order`` taken from
    ``finish``. start, finish (C, H, W) -> (len(counts), C, H, W). Deletion: start = x,
    finish = 0; insertion: start = blur(x), finish = x."""
    import torch

    h, w = start.shape[-2:]
    rank = torch.empty(h * w, dtype=torch.long)
    rank[order] = torch.arange(h * w)  # position of each pixel in the order
    rank = rank.to(start.device).reshape(1, 1, h, w)
    n = torch.tensor(list(counts), device=start.device).reshape(-1, 1, 1, 1)
    take = rank < n  # (K, 1, H, W)
    return torch.where(take, finish[None], start[None])


def auc(curve: Sequence[float]) -> float:
    """Area under a curve sampled at evenly spaced points of [0, 1] (trapezoid rule)."""
    ys = [float(v) for v in curve]
    if len(ys) < 2:
        raise ValueError("a curve needs at least two points")
    return (sum(ys) - (ys[0] + ys[-1]) / 2) / (len(ys) - 1)


def road_masks(order: torch.Tensor, hw: tuple[int, int], fractions: Sequence[float],
               most_relevant_first: bool) -> torch.Tensor:
    """Removal masks (F, H, W) bool: the round(f * H * W) most (or least) relevant pixels."""
    import torch

    h, w = hw
    n = h * w
    rank = torch.empty(n, dtype=torch.long)
    rank[order] = torch.arange(n)
    if not most_relevant_first:
        rank = n - 1 - rank
    counts = torch.tensor([round(f * n) for f in fractions]).reshape(-1, 1)
    return (rank[None] < counts).reshape(len(fractions), h, w)


# ----------------------------------------------------------------------------- scores
def road_scores(morf: Sequence[float], lerf: Sequence[float]) -> dict[str, float]:
    """Mean MoRF and LeRF probabilities over the fractions, and (LeRF - MoRF) / 2."""
    mo = sum(morf) / len(morf)
    le = sum(lerf) / len(lerf)
    return {"road_morf": mo, "road_lerf": le, "road": (le - mo) / 2}


def confidence_change(original: float, masked: float) -> dict[str, float]:
    """Chattopadhyay et al. 2018, Eq. 21-22 for one image: drop in percent of the original
    confidence, and increase as 100 (confidence went up) or 0."""
    drop = max(0.0, original - masked) / original * 100 if original > 0 else float("nan")
    return {"drop": drop, "increase": 100.0 if masked > original else 0.0}


def box_mask(hw: tuple[int, int], boxes: Sequence[Sequence[float]]) -> torch.Tensor:
    """(H, W) bool: pixels whose centre lies in any box (x0, y0, x1, y1), input pixels."""
    import torch

    h, w = hw
    ys = torch.arange(h, dtype=torch.float64)[:, None] + 0.5
    xs = torch.arange(w, dtype=torch.float64)[None, :] + 0.5
    out = torch.zeros(h, w, dtype=torch.bool)
    for x0, y0, x1, y1 in boxes:
        out |= (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
    return out


def pointing_hit(saliency: torch.Tensor, inside: torch.Tensor) -> float:
    """1.0 when the map's maximum (the centroid of its maxima when tied) lies in ``inside``."""
    import torch

    s = saliency.detach().float().cpu()
    where = torch.nonzero(s == s.max()).float().mean(dim=0)  # (row, col)
    i, j = (min(max(round(float(v)), 0), n - 1) for v, n in zip(where, s.shape))
    return 1.0 if bool(inside[i, j]) else 0.0


def energy_fraction(saliency: torch.Tensor, inside: torch.Tensor) -> float:
    """Share of the map's mass inside the boxes; NaN for an all-zero map."""
    s = saliency.detach().double().cpu().clamp_min(0)
    total = float(s.sum())
    return float(s[inside].sum()) / total if total > 0 else float("nan")


def mean_ranks(rows: Sequence[dict[str, float]]) -> list[float | None]:
    """Each row's mean rank (1 = best) over the ranked scores it has, ties sharing the mean
    of their places; NaN scores rank last. ``None`` for a row with no ranked score."""
    sums = [0.0] * len(rows)
    counts = [0] * len(rows)
    for key, (_, higher, ranked) in SCORES.items():
        if not ranked:
            continue
        have = [(i, r[key]) for i, r in enumerate(rows) if key in r and r[key] is not None]
        if not have:
            continue

        def value(v: float, higher: bool = higher) -> float:
            return math.inf if math.isnan(v) else (-v if higher else v)

        for i, v in have:
            better = sum(1 for _, o in have if value(o) < value(v))
            same = sum(1 for _, o in have if value(o) == value(v))
            sums[i] += better + (same + 1) / 2
            counts[i] += 1
    return [s / n if n else None for s, n in zip(sums, counts)]


def summarise(scores: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The mean of each score over maps (NaN ignored; ``None`` when no map has it)."""
    out: dict[str, float | None] = {}
    for key in SCORES:
        vals = [float(s[key]) for s in scores if s.get(key) is not None and not math.isnan(float(s[key]))]
        if any(key in s for s in scores):
            out[key] = sum(vals) / len(vals) if vals else None
    return out
