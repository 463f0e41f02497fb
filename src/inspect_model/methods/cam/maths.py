"""The maths of the CAM family: maps from captured activations (and gradients), pure functions.

Every function here takes tensors already in channels-first spatial form, ``A`` and ``G`` of
shape (N, C, h, w) (activations of the chosen layer and d(score)/dA for one target class per
sample), and returns the *raw* map (N, h, w): the weighted channel sum before ReLU and
normalisation, so that a report can say what the map's real range was. ``finish_maps``
then applies the ReLU, upsamples to the input resolution and normalises each map to [0, 1],
and ``map_warnings`` says when a map is constant, empty or not finite.

The definitions follow the papers and pytorch-grad-cam (whose formulas are the de-facto
reference): Grad-CAM (Selvaraju et al. 2017), Grad-CAM++ (Chattopadhyay et al. 2018, the
closed form for exponential scores), XGrad-CAM (Fu et al. 2020), Layer-CAM (Jiang et al.
2021), HiResCAM (Draelos & Carin 2020), CAM (Zhou et al. 2016), Score-CAM (Wang et al. 2020)
and Eigen-CAM (Muhammad & Yeasin 2020). Token layouts (ViT, Swin) are turned into (N, C, h, w)
by :func:`to_spatial` before any of this runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


# ----------------------------------------------------------------------------- gradient maps
def gradient_map(method: str, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Raw map (N, h, w) of one gradient-based method from A, G (N, C, h, w); for a clip's
    (N, C, t, h, w) the same formulas over (t, h, w) give (N, t, h, w) (methods/cam/video.py)."""
    import torch

    sp = tuple(range(2, A.dim()))  # the spatial (and temporal) dims

    if method == "gradcam":
        # Selvaraju et al. 2017, Eq. 1-2: alpha_k = mean_ij dS/dA_k_ij.
        w = G.mean(dim=sp, keepdim=True)
        return (w * A).sum(dim=1)
    if method == "hirescam":
        # Draelos & Carin 2020: the element-wise product, no spatial averaging of gradients.
        return (G * A).sum(dim=1)
    if method == "xgradcam":
        # Fu et al. 2020, Eq. 9: alpha_k = sum_ij (A_k_ij / sum_ij A_k_ij) dS/dA_k_ij.
        w = (G * A).sum(dim=sp, keepdim=True) / (A.sum(dim=sp, keepdim=True) + EPS)
        return (w * A).sum(dim=1)
    if method == "layercam":
        # Jiang et al. 2021: a per-location weight relu(dS/dA_k_ij) times the activation.
        return (torch.relu(G) * A).sum(dim=1)
    if method == "gradcam++":
        # Chattopadhyay et al. 2018, Eq. 19 with Y = exp(S): the exp(S) factors cancel in
        # alpha, and the one left in the weights only scales the map (and overflows for large
        # scores), so it is dropped as pytorch-grad-cam does.
        g2 = G * G
        g3 = g2 * G
        sum_a = A.sum(dim=sp, keepdim=True)
        alpha = g2 / (2 * g2 + sum_a * g3 + EPS)
        alpha = torch.where(G != 0, alpha, torch.zeros_like(alpha))
        w = (torch.relu(G) * alpha).sum(dim=sp, keepdim=True)
        return (w * A).sum(dim=1)
    raise ValueError(f"not a gradient method: {method}")


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


# ----------------------------------------------------------------------------- the registry
@dataclass
class MapInputs:
    """What a method's function gets for one layer: ``A`` (N, C, h, w); ``grads``, one
    d(score)/dA (N, C, h, w) per target rank (K of them) when the method needs gradients;
    ``classes`` (N, K); and two callbacks for the methods that need more than the pass:
    ``fc_weight()`` (CAM's classifier weights, UsageError when the network does not end in
    global pooling + one linear layer) and ``masked_scores()`` (Score-CAM's channel weights
    (N, K, C) from its masked forward passes)."""

    A: torch.Tensor
    grads: list[torch.Tensor] | None
    classes: torch.Tensor
    fc_weight: Callable[[], torch.Tensor]
    masked_scores: Callable[[], torch.Tensor]

    @property
    def k(self) -> int:
        return int(self.classes.shape[1])


@dataclass(frozen=True)
class CamMethod:
    """One CAM method: its function (MapInputs -> raw maps (K, N, h, w)) and the properties
    the rest of the code reads (parsing, ``all``, help, passes, the report)."""

    name: str
    title: str
    paper: str
    fn: Callable[[MapInputs], Any]
    needs_gradients: bool = False  # captured in the one backward pass that stops at the layer
    one_pass: bool = True  # from the single forward (+ backward) pass; False: passes of its own
    in_all: str = "no"  # "yes", "if-fits" (skipped with a note where the network does not fit), "no"


def _gradient(method: str) -> Callable[[MapInputs], Any]:
    def fn(inp: MapInputs) -> Any:
        import torch

        assert inp.grads is not None
        return torch.stack([gradient_map(method, inp.A, G.to(inp.A.dtype)) for G in inp.grads])

    return fn


def _cam(inp: MapInputs) -> Any:
    import torch

    w = inp.fc_weight()
    return torch.stack([cam_map(inp.A, w, inp.classes[:, j]) for j in range(inp.k)])


def _eigen(inp: MapInputs) -> Any:
    import torch

    n, sp = inp.A.shape[0], inp.A.shape[2:]
    ok = torch.isfinite(inp.A.reshape(n, -1)).all(1)  # (N,)
    if bool(ok.all()):
        return eigen_map(inp.A)[None].expand(inp.k, *[-1] * (1 + len(sp)))
    # No SVD of NaN/Inf (LinAlgError): those images get a NaN map, reported like any other
    # NaN map; the images with finite activations keep theirs (issue 14).
    out = torch.full((n, *sp), float("nan"), dtype=inp.A.dtype, device=inp.A.device)
    if bool(ok.any()):
        out[ok] = eigen_map(inp.A[ok]).to(out.dtype)
    return out[None].expand(inp.k, *[-1] * (1 + len(sp)))


def _score(inp: MapInputs) -> Any:
    import torch

    weights = inp.masked_scores()  # (N, K, C)
    return torch.stack([scorecam_map(inp.A[i].float(), weights[i]) for i in range(inp.A.shape[0])], dim=1)


REGISTRY: dict[str, CamMethod] = {m.name: m for m in (
    CamMethod("cam", "CAM", "Zhou et al. 2016", _cam, in_all="if-fits"),
    CamMethod("gradcam", "Grad-CAM", "Selvaraju et al. 2017", _gradient("gradcam"), needs_gradients=True,
              in_all="yes"),
    CamMethod("gradcam++", "Grad-CAM++", "Chattopadhyay et al. 2018", _gradient("gradcam++"),
              needs_gradients=True, in_all="yes"),
    CamMethod("xgradcam", "XGrad-CAM", "Fu et al. 2020", _gradient("xgradcam"), needs_gradients=True,
              in_all="yes"),
    CamMethod("layercam", "Layer-CAM", "Jiang et al. 2021", _gradient("layercam"), needs_gradients=True,
              in_all="yes"),
    CamMethod("hirescam", "HiResCAM", "Draelos & Carin 2020", _gradient("hirescam"), needs_gradients=True,
              in_all="yes"),
    CamMethod("scorecam", "Score-CAM", "Wang et al. 2020", _score, one_pass=False),
    CamMethod("eigencam", "Eigen-CAM", "Muhammad & Yeasin 2020", _eigen),
)}
METHODS = tuple(REGISTRY)
GRADIENT_METHODS = tuple(m.name for m in REGISTRY.values() if m.needs_gradients)
GROUPS = {  # --method names that stand for several methods
    "all": tuple(m.name for m in REGISTRY.values() if m.in_all != "no"),
    "gradients": GRADIENT_METHODS,
}


def method_help() -> str:
    """``--method``'s help, from the registry."""
    names = ", ".join(METHODS)
    fits = [m.name for m in REGISTRY.values() if m.in_all == "if-fits"]
    return (f"{names}; all ({' + '.join(fits)} where the net fits it, and "
            f"{', '.join(n for n in GROUPS['all'] if n not in fits)}: one pass) or gradients "
            f"({', '.join(GRADIENT_METHODS)}); repeatable. Default gradcam.")
