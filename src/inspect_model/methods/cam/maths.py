"""The maths of the CAM family: maps from captured activations (and gradients), pure functions.

Every function here takes tensors already in channels-first spatial form, ``A`` and ``G`` of
shape (N, C, h, w) (activations of the chosen layer and d(score)/dA for one target class per
sample), and returns the *raw* map (N, h, w): the weighted channel sum before ReLU and
normalisation, so that a report can say what the map's real range was. ``finish_maps``
then applies the ReLU, upsamples to the input resolution and normalises each map to [0, 1],
and ``map_warnings`` says when a map is constant, empty or not finite. Each method's own
formula is in its module under :mod:`.variants` (the registry: :mod:`.base`); the shared
pieces (CAM's and Eigen-CAM's maps, Score-CAM's masks) stay here.

The definitions follow the papers and pytorch-grad-cam (whose formulas are the de-facto
reference): Grad-CAM (Selvaraju et al. 2017), Grad-CAM++ (Chattopadhyay et al. 2018, the
closed form for exponential scores), XGrad-CAM (Fu et al. 2020), Layer-CAM (Jiang et al.
2021), HiResCAM (Draelos & Carin 2020), CAM (Zhou et al. 2016), Score-CAM (Wang et al. 2020)
and Eigen-CAM (Muhammad & Yeasin 2020). Token layouts (ViT, Swin) are turned into (N, C, h, w)
by :func:`to_spatial` before any of this runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

EPS = 1e-7  # as pytorch-grad-cam, in the denominators of XGrad-CAM and Grad-CAM++


# ----------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """How a layer's output maps onto a spatial grid.

    ``nchw``: (N, C, h, w) as is; ``nhwc``: (N, h, w, C) (torchvision's Swin);
    ``tokens``: (N, T, D) with ``prefix`` leading tokens (class/register tokens) dropped and
    the remaining ``grid[0] * grid[1]`` patch tokens laid out row-major.
    """

    kind: str
    grid: tuple[int, ...]  # (h, w), or (t, h, w) for a clip's layer
    prefix: int = 0
    channels: int = 0

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "grid": list(self.grid), "prefix_tokens": self.prefix,
                "channels": self.channels}


def _to_spatial3d(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """(N, C, t, h, w) view of a clip layer's output in ``layout``."""
    if layout.kind == "ncthw":
        return t
    if layout.kind == "nthwc":
        return t.permute(0, 4, 1, 2, 3)
    gt, gh, gw = layout.grid
    tokens = t[:, layout.prefix:, :]  # (N, t*h*w, D)
    return tokens.transpose(1, 2).reshape(t.shape[0], t.shape[2], gt, gh, gw)


def to_spatial(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """(N, C, h, w) view of a layer output (or of its gradient) in ``layout``; (N, C, t, h, w)
    for a clip's layouts (methods/cam/video.py)."""
    if layout.kind == "nchw":
        return t
    if len(layout.grid) == 3:  # a clip's layer
        return _to_spatial3d(t, layout)
    if layout.kind == "nhwc":
        return t.permute(0, 3, 1, 2)
    gh, gw = layout.grid
    tokens = t[:, layout.prefix:, :]  # (N, h*w, D)
    return tokens.transpose(1, 2).reshape(t.shape[0], t.shape[2], gh, gw)


def token_grid(tokens: int, input_hw: tuple[int, int], max_prefix: int = 16) -> tuple[int, tuple[int, int]] | None:
    """``(prefix, (gh, gw))`` for ``tokens`` tokens on an input of ``input_hw``: the fewest
    leading tokens to drop so that the rest form a grid with the input's aspect ratio."""
    h, w = input_hw
    for prefix in range(min(max_prefix, tokens - 1) + 1):
        n = tokens - prefix
        gh = round(math.sqrt(n * h / w))
        for cand in (gh - 1, gh, gh + 1):
            if cand >= 1 and n % cand == 0:
                cw = n // cand
                # Same aspect ratio as the input, to within one patch.
                if abs(cand * w - cw * h) <= max(h, w) / max(cand, cw) + 1e-9 and cand * cw > 1:
                    return prefix, (cand, cw)
    return None


# ----------------------------------------------------------------------------- CAM and Eigen-CAM
def cam_map(A: torch.Tensor, fc_weight: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """CAM (Zhou et al. 2016, Eq. 2): M_c = sum_k w_k^c A_k for class ``classes[n]``.

    A (N, C, h, w); fc_weight (classes, C); classes (N,) long -> (N, h, w)."""
    w = fc_weight[classes].to(A.dtype)  # (N, C)
    return (w.reshape(*w.shape, *[1] * (A.dim() - 2)) * A).sum(dim=1)


def eigen_map(A: torch.Tensor) -> torch.Tensor:
    """Eigen-CAM: the activations projected on their first principal component.

    A (N, C, h, w) -> (N, h, w). The SVD's sign is arbitrary; it is fixed so that the map
    correlates positively with the channel sum (pytorch-grad-cam leaves it to chance). Where
    the channel sum says nothing (|cosine| below SIGN_MIN_COS, or its variation below 1e-3 of
    the map's: a LayerNorm output sums to about the same at every token), the map's largest magnitude is made positive instead
    (the svd_flip convention), so the sign no longer follows rounding noise."""
    import torch

    n, c = A.shape[:2]
    sp = A.shape[2:]  # (h, w), or (t, h, w) for a clip
    X = A.reshape(n, c, -1).transpose(1, 2)  # (N, hw, C)
    X = X - X.mean(dim=1, keepdim=True)
    _, _, vh = torch.linalg.svd(X, full_matrices=False)  # vh (N, min(hw,C), C)
    proj = (X @ vh[:, 0, :, None]).squeeze(-1)  # (N, hw)
    ref = A.sum(dim=1).reshape(n, -1)
    ref = ref - ref.mean(dim=1, keepdim=True)
    dot = (proj * ref).sum(dim=1)
    cos = dot / (proj.norm(dim=1) * ref.norm(dim=1)).clamp_min(1e-30)
    peak = proj.gather(1, proj.abs().argmax(dim=1, keepdim=True))[:, 0]
    says = (cos.abs() >= SIGN_MIN_COS) & (ref.norm(dim=1) >= 1e-3 * proj.norm(dim=1))  # not rounding noise
    by = torch.where(says, dot, peak)
    sign = torch.where(by < 0, -1.0, 1.0).to(proj.dtype)
    return (proj * sign[:, None]).reshape(n, *sp)


SIGN_MIN_COS = 0.05  # eigen_map: below this the channel sum does not decide the sign


# ----------------------------------------------------------------------------- Score-CAM
def scorecam_masks(A: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
    """Score-CAM's masks H_k (Wang et al. 2020, Eq. 4-5) for one sample: each channel
    upsampled to the input and min-max normalised. A (C, h, w) -> (C, H, W); a constant
    channel gives an all-zero mask. Constancy is judged on ``A`` itself: upsampling a
    constant 7.0 can give 6.9999995 here and there, which normalising would blow up into a
    mask of rounding noise."""
    import torch.nn.functional as F

    mode = "trilinear" if len(input_hw) == 3 else "bilinear"  # a clip's (T, H, W)
    low = A.reshape(A.shape[0], -1)
    varies = (low.max(dim=1).values > low.min(dim=1).values).reshape(-1, *[1] * len(input_hw))
    up = F.interpolate(A[None].float(), size=input_hw, mode=mode, align_corners=False)[0]
    flat = up.reshape(up.shape[0], -1)
    lo = flat.min(dim=1).values.reshape(-1, *[1] * len(input_hw))
    hi = flat.max(dim=1).values.reshape(-1, *[1] * len(input_hw))
    span = hi - lo
    return ((up - lo) / span.clamp_min(1e-12)) * ((span > 0) & varies)


def scorecam_map(A: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Raw Score-CAM map: sum_k alpha_k A_k. A (C, h, w), weights (K, C) -> (K, h, w), where
    alpha_k is the softmax probability of the target class on the masked input X * H_k (the
    authors' implementation; the paper's baseline term is a constant that it omits)."""
    w = weights.reshape(*weights.shape, *[1] * (A.dim() - 1)).to(A.dtype)
    return (w * A[None]).sum(dim=1)


# ----------------------------------------------------------------------------- finishing
def finish_maps(raw: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
    """ReLU, bilinear upsampling to ``input_hw`` and min-max normalisation to [0, 1].

    raw (M, h, w) -> (M, H, W) float32. A map with no positive value (or no spread, or not
    finite) becomes all zeros; :func:`map_warnings` reports it, never silently."""
    import torch
    import torch.nn.functional as F

    pos = torch.nan_to_num(torch.relu(raw.float()), nan=0.0, posinf=0.0, neginf=0.0)
    mode = "trilinear" if len(input_hw) == 3 else "bilinear"  # a clip's (T, H, W): one scale per clip
    up = F.interpolate(pos[:, None], size=tuple(input_hw), mode=mode, align_corners=False)[:, 0]
    flat = up.reshape(up.shape[0], -1)
    lo = flat.min(dim=1).values.reshape(-1, *[1] * len(input_hw))
    hi = flat.max(dim=1).values.reshape(-1, *[1] * len(input_hw))
    span = hi - lo
    return ((up - lo) / span.clamp_min(1e-30)) * (span > 0)


NUMERIC_ZERO = "the map is numerically zero"
#: A map whose largest |value| is below this fraction of the terms it sums is float rounding
#: noise (float32 keeps ~1e-7 of a sum; 100x that): drawn blank and said so (issue 39).
ZERO_RELATIVE = 1e-5
#: ... and a map whose peak is below this fraction of the score per location (a map's values
#: are in the score's units: Grad-CAM's mean is about score / locations).
ZERO_OF_SCORE = 1e-6


def term_scale(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """(N,) the size of the terms a gradient map sums: the largest, over locations, sum over
    channels of |dS/dA * A| (A, G: (N, C, ...))."""
    t = (A.detach().abs().float() * G.detach().abs().float()).sum(1)
    return t.reshape(t.shape[0], -1).amax(1)


def is_numeric_zero(warnings: list[str]) -> bool:
    return any(w.startswith(NUMERIC_ZERO) for w in warnings)


def map_warnings(raw: torch.Tensor, scale: float | None = None, score: float | None = None) -> list[str]:
    """Why a raw map (h, w) cannot be trusted, as short sentences; [] when it is fine.
    ``scale``: the size of the terms the map sums (:func:`term_scale`); ``score``: the target's
    score, whose share per location a map of evidence for it reaches (``ZERO_OF_SCORE``)."""
    import torch

    finite = torch.isfinite(raw)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        return [f"the map has {bad} NaN/Inf value(s) of {raw.numel()}; it is shown with them as 0"]
    lo, hi = float(raw.min()), float(raw.max())
    if hi == lo:
        return [(f"the map is constant ({hi:.4g} everywhere): the layer carries no spatial "
                 "evidence for this target (zero gradients or activations)")]
    peak = max(abs(lo), abs(hi))
    if scale is not None and scale > 0 and peak <= ZERO_RELATIVE * scale:
        return [(f"{NUMERIC_ZERO}: its largest |value| {peak:.3g} is {peak / scale:.1g} of the terms it sums "
                 f"({scale:.3g}), float rounding noise, not evidence; drawn blank")]
    share = abs(score) / raw.numel() if score else 0.0  # the score spread evenly over the locations
    if share > 0 and peak <= ZERO_OF_SCORE * share:
        return [(f"{NUMERIC_ZERO}: its largest |value| {peak:.3g} is {peak / share:.1g} of the target's score "
                 f"per location ({abs(score or 0):.3g} over {raw.numel()}): the gradients hardly reach the layer, "
                 "float rounding noise, not evidence; drawn blank")]
    if hi <= 0:
        return [(f"the map is empty: no location has positive evidence (raw max {hi:.4g}); "
                 "after ReLU it is zero everywhere")]
    return []
