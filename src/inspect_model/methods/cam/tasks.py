"""Class activation maps of detections and segmentation targets (issue 24).

One forward pass with the map layer's output made a graph root (every parameter frozen, so
nothing below the layer builds a graph); the objective (:mod:`.detection`,
:mod:`.segmentation`) reads its rows from that pass; then one backward pass per row rank
(the rows of one rank over the batch are summed: samples are independent) runs from the
scores down to the layer only. Eigen-CAM needs the activations alone and so works on every
detector, gradients or not.

A layer that returns several maps -- a feature pyramid's ``OrderedDict`` of levels -- is
combined on one grid: every level's activations and gradients are resized (bilinear) to
the grid of the finest level with at most :data:`MAX_GRID_CELLS` cells and concatenated
along channels, and the method then runs on that one (N, sum C, h, w) tensor. For Grad-CAM
this is the sum of the levels' own maps, each upsampled (the channel weights are spatial
means, which resizing keeps); Eigen-CAM takes one principal component across all levels
(pytorch-grad-cam's FasterRCNN tutorial does the same on the coarsest grid).

torchvision's detectors resize and pad their inputs (``GeneralizedRCNNTransform``): the
feature grid covers the padded, resized image, so each sample's map is cropped to its own
image's part of the grid before it is resized to the input.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, ModelRuntimeError, UsageError
from inspect_model.methods.cam import base
from inspect_model.methods.cam import maths as cm
from inspect_model.methods.objectives.scores import Row, Selection

if TYPE_CHECKING:
    import torch
    from torch import nn

MAX_GRID_CELLS = 64 * 64  # the combined grid of a pyramid: the finest level within this many cells


@dataclass
class TaskMap:
    """One map: one row (a detection or a class's mask), one method, one layer."""

    row: Row
    method: str
    layer: str
    map: torch.Tensor  # (H_in, W_in) float32 in [0, 1], CPU
    raw: torch.Tensor  # (h, w) before ReLU and normalisation
    raw_min: float
    raw_max: float
    warnings: list[str] = field(default_factory=list)
    class_independent: bool = False  # the method's map is the same for every row (Eigen-CAM)

    def stats(self) -> dict[str, Any]:
        """Where the map's mass lies: its peak (input pixels) and, for a detection, the share
        of the map inside the detection's box."""
        m = self.map
        flat = int(m.argmax()) if m.numel() else 0
        h, w = m.shape
        out: dict[str, Any] = {"peak": [flat % w, flat // w], "mean": float(m.mean())}
        box = self.row.box
        if box is not None:
            x0, y0, x1, y1 = (int(round(v)) for v in box)
            inside = m[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)]
            total = float(m.sum())
            out["energy_in_box"] = float(inside.sum()) / total if total > 0 else None
            px, py = out["peak"]
            out["peak_in_box"] = bool(x0 <= px <= x1 and y0 <= py <= y1)
        return out


@dataclass
class TaskCamResult:
    selection: Selection
    maps: list[TaskMap]
    layer: dict[str, Any]  # name, kind (nchw / tokens / pyramid), grid, channels, levels
    passes: dict[str, int]
    notes: list[str] = field(default_factory=list)


def check_task_methods(methods: Sequence[str], task: str) -> list[str]:
    """The methods that apply to a detector or segmenter: the gradient methods and Eigen-CAM.
    CAM (a classifier's fc weights) and Score-CAM (softmax of class scores on masked inputs)
    have no meaning there: named, they are refused; from ``all``, left out."""
    fits = base.task_names(task)
    bad = [m for m in methods if m not in fits]
    if bad:
        raise UsageError(f"--method {bad[0]} does not apply to a {task} model; use "
                         f"{', '.join(fits)}")
    return list(methods)


@contextlib.contextmanager
def rooted(module: nn.Module, roots: dict[str, Any], *, grads: bool) -> Any:
    """A forward hook that replaces ``module``'s output tensors (a tensor, or a dict/list
    of them) by graph roots, recorded in ``roots``; removed on exit. The network runs on
    clones, so an in-place op downstream cannot touch a root."""
    import torch

    def root(key: str, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        leaf = t.detach().requires_grad_(grads)
        roots[key] = leaf
        return leaf.clone() if grads else leaf

    def hook(mod: Any, args: Any, out: Any) -> Any:
        roots.clear()  # the last call of a reused module wins
        if isinstance(out, dict):
            return type(out)((k, root(str(k), v)) for k, v in out.items())
        if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
            return type(out)(root(str(i), v) for i, v in enumerate(out))
        return root("", out)

    handle = module.register_forward_hook(hook)
    try:
        yield roots
    finally:
        handle.remove()


@contextlib.contextmanager
def transform_sizes(model: nn.Module, sizes: dict[str, Any]) -> Any:
    """Record a torchvision detector's resized image sizes and padded batch size."""
    t = getattr(model, "transform", None)
    if t is None or type(t).__name__ != "GeneralizedRCNNTransform":
        yield sizes
        return

    def hook(mod: Any, args: Any, out: Any) -> None:
        images = out[0]
        sizes["image_sizes"] = [tuple(int(v) for v in s) for s in images.image_sizes]
        sizes["padded"] = tuple(int(v) for v in images.tensors.shape[-2:])

    handle = t.register_forward_hook(hook)
    try:
        yield sizes
    finally:
        handle.remove()


def combine(parts: dict[str, torch.Tensor], layout: Any) -> torch.Tensor:
    """One (N, C, h, w) tensor of a layer's captured parts (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    if layout is not None:
        return cm.to_spatial(parts[""], layout).float()
    levels = [t.float() for t in parts.values() if t.dim() == 4]
    grid = pyramid_grid([tuple(t.shape[-2:]) for t in levels])
    return torch.cat([t if tuple(t.shape[-2:]) == grid else
                      F.interpolate(t, size=grid, mode="bilinear", align_corners=False) for t in levels], dim=1)


def pyramid_grid(shapes: list[tuple[int, ...]]) -> tuple[int, int]:
    by_size = sorted(shapes, key=lambda s: s[0] * s[1])
    fits = [s for s in by_size if s[0] * s[1] <= MAX_GRID_CELLS]
    g = fits[-1] if fits else by_size[0]
    return int(g[0]), int(g[1])


def finish(raw: torch.Tensor, crop: tuple[float, float], hw: tuple[int, int]) -> torch.Tensor:
    """ReLU, the sample's part of the grid (``crop``: fractions of height and width),
    bilinear resizing to the input and min-max normalisation: (h, w) -> (H, W) in [0, 1]."""
    import torch
    import torch.nn.functional as F

    pos = torch.nan_to_num(torch.relu(raw.float()), nan=0.0, posinf=0.0, neginf=0.0)[None, None]
    if crop != (1.0, 1.0):
        h, w = raw.shape
        scale = 16  # crop on a finer grid: the image's edge need not fall on a cell's
        fine = F.interpolate(pos, size=(h * scale, w * scale), mode="bilinear", align_corners=False)
        pos = fine[..., : max(1, round(h * scale * crop[0])), : max(1, round(w * scale * crop[1]))]
    up = F.interpolate(pos, size=hw, mode="bilinear", align_corners=False)[0, 0]
    lo, hi = up.min(), up.max()
    return ((up - lo) / (hi - lo).clamp_min(1e-30)) * (hi > lo)


def compute_task_cams(model: nn.Module, x: torch.Tensor, objective: Any, layer: str,
                      methods: Sequence[str]) -> TaskCamResult:
    """Maps of ``methods`` at ``layer`` for every row ``objective`` selects in batch ``x``."""
    import torch

    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.methods.cam.layers import infer_layout

    methods = check_task_methods(methods, objective.task)
    grads = any(base.get(m).needs_gradients for m in methods)
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    module = dict(model.named_modules()).get(layer)
    if module is None:
        raise LayerSelectionError(f"layer '{layer}' is not a module of this model")
    passes = {"forward": 1, "backward": 0, "scorecam_forward": 0}
    roots: dict[str, Any] = {}
    sizes: dict[str, Any] = {}
    opts = CaptureOptions(outputs=False, freeze_params=True, grad_enabled=grads)
    with HookEngine(model, [], opts) as eng, objective.context(), rooted(module, roots, grads=grads), \
            transform_sizes(model, sizes):
        out = run_forward(eng, lambda: model(x.detach()))
        if not roots:
            raise LayerSelectionError(f"layer '{layer}' gave no floating-point output in the forward pass; "
                                      "pick a layer that runs, e.g. --layer auto")
        sel = objective.select(out, x)
        parts = {k: v.detach() for k, v in roots.items()}
        layout = None
        if list(parts) == [""]:
            layout = infer_layout(model, layer, tuple(parts[""].shape), hw)
        A = combine(parts, layout)  # (N, C, h, w)
        rank_grads: list[torch.Tensor | None] = []
        if grads and sel.rows:
            if not sel.scores.requires_grad:
                raise ModelRuntimeError(
                    f"gradients do not reach the {objective.task} scores from layer '{layer}'; "
                    "use --method eigencam (no gradients), or another layer")
            for j in range(sel.ranks()):
                total = sel.rank_sum(j)
                assert total is not None
                got = torch.autograd.grad(total, list(roots.values()), retain_graph=j < sel.ranks() - 1,
                                          allow_unused=True)
                passes["backward"] += 1
                g_parts = {k: (g if g is not None else torch.zeros_like(roots[k])).detach()
                           for k, g in zip(roots, got)}
                rank_grads.append(combine(g_parts, layout))
    info = _layer_info(layer, parts, layout, A)
    maps = _maps(sel, A, rank_grads, methods, layer, hw, _crops(sizes, A.shape[0]))
    return TaskCamResult(sel, maps, info, passes, list(sel.notes))


def _crops(sizes: dict[str, Any], n: int) -> list[tuple[float, float]]:
    if "image_sizes" not in sizes:
        return [(1.0, 1.0)] * n
    ph, pw = sizes["padded"]
    return [(h / ph, w / pw) for h, w in sizes["image_sizes"]]


def _layer_info(name: str, parts: dict[str, Any], layout: Any, A: torch.Tensor) -> dict[str, Any]:
    if layout is not None:
        return {"name": name, "output_shape": list(parts[""].shape[1:]), **layout.describe()}
    return {"name": name, "output_shape": list(A.shape[1:]), "kind": "pyramid", "grid": list(A.shape[-2:]),
            "prefix_tokens": 0, "channels": int(A.shape[1]),
            "levels": {k: list(v.shape[1:]) for k, v in parts.items()}}


def _maps(sel: Selection, A: torch.Tensor, rank_grads: list[Any], methods: Sequence[str], layer: str,
          hw: tuple[int, int], crops: list[tuple[float, float]]) -> list[TaskMap]:
    same: dict[tuple[int, str], torch.Tensor] = {}  # class-independent maps, once per sample
    out: list[TaskMap] = []
    for row in sel.rows:
        i = row.sample
        for m in methods:
            method = base.get(m)
            G = rank_grads[row.rank][i:i + 1] if method.needs_gradients else None
            if method.class_independent:
                if (i, m) not in same:
                    same[(i, m)] = method.row_map(A[i:i + 1], G)[0]
                raw = same[(i, m)]
            else:
                raw = method.row_map(A[i:i + 1], G)[0]
            scale = float(cm.term_scale(A[i:i + 1], G)[0]) if G is not None else None
            raw = raw.detach().float().cpu()
            warns = cm.map_warnings(raw, scale, row.confidence if scale is not None else None)
            shown = finish(raw, crops[i], hw)
            if cm.is_numeric_zero(warns):
                shown = shown * 0.0  # noise is not stretched to full contrast (issue 39)
            out.append(TaskMap(row, m, layer, shown, raw, float(raw.min()), float(raw.max()), warns,
                               method.class_independent))
    return out
