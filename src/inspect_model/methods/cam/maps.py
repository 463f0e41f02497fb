"""Class activation maps as a Python API: maps in, records out.

:func:`compute_cams` computes any mix of the CAM family for one batch and returns
:class:`CamMap` records (raw layer-resolution map, normalised input-resolution map, raw range,
warnings). Every gradient-based method comes from the same single forward pass and one
*partial* backward pass per target rank (see :mod:`.cam_passes`): no parameter gradients and
nothing below the layer. Score-CAM adds its batched masked forward passes; Eigen-CAM and CAM
need the activations only. :func:`gradcam` is the small tensor-in, tensor-out entry point
other methods (guided Grad-CAM) build on.

The parts: :mod:`.maths` (the formulas), :mod:`.layers` (``--layer auto`` and the
layout of token / channels-last outputs), :mod:`.cam_passes` (the passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.cam import maths as cm
from inspect_model.methods.cam import passes as cp
from inspect_model.methods.cam.layers import (
    CamLayer,
    auto_layer,
    infer_layout,
    input_dims,
    resolve_layer,
    resolve_layers,
)
from inspect_model.methods.cam import base

if TYPE_CHECKING:
    import torch
    from torch import nn

    from inspect_model.methods.objectives.targets import TargetSpec

__all__ = [
    "CamLayer",
    "CamMap",
    "CamResult",
    "auto_layer",
    "compute_cams",
    "gradcam",
    "parse_methods",
    "parse_reshape",
    "resolve_layer",
    "resolve_layers",
]


@dataclass
class CamMap:
    """One map: one sample, one target, one method, one layer."""

    sample: int
    rank: int  # 0 for the first target of the sample (top:K gives ranks 0..K-1)
    target: int  # class index the map explains (Eigen-CAM does not depend on it)
    method: str
    layer: str
    map: torch.Tensor  # (H_in, W_in) float32 in [0, 1], on the CPU
    raw: torch.Tensor | None  # (h, w) before ReLU and normalisation; None for fused maps
    raw_min: float
    raw_max: float
    warnings: list[str] = field(default_factory=list)
    class_independent: bool = False  # the method's map is the same for every target (Eigen-CAM)


@dataclass
class CamResult:
    """The maps of one batch plus what the report needs besides them."""

    scores: torch.Tensor  # (N, classes) the selected output, on the CPU
    targets: list[list[int]]  # class indices per sample, K each
    layers: list[CamLayer]
    maps: list[CamMap]
    input_hw: tuple[int, int]
    passes: dict[str, int]  # forward / backward / scorecam forward passes run
    notes: list[str] = field(default_factory=list)  # e.g. CAM left out of `all`

    @property
    def probabilities(self) -> torch.Tensor:
        from inspect_model.methods.objectives.targets import class_probabilities

        return class_probabilities(self.scores.float())


# ----------------------------------------------------------------------------- options
def _tokens(items: Sequence[str] | None) -> list[tuple[str, str]]:
    aliases = base.aliases()
    out = []
    for item in items or ["gradcam"]:
        for raw in item.split(","):
            m = raw.strip().lower().replace("_", "").replace("-", "")
            if m:
                out.append((raw.strip(), aliases.get(m, m)))
    return out


def cam_is_optional(items: Sequence[str] | None) -> bool:
    """True when CAM comes only from ``all``: then a network it does not fit skips it with a
    note instead of failing the run."""
    names = [m for _, m in _tokens(items)]
    optional = {n for n, m in base.methods().items() if m.in_all == "if-fits"}
    return not optional & set(names)


def parse_methods(items: Sequence[str] | None) -> list[str]:
    """``--method`` values (repeatable, comma lists) in a fixed order. ``all`` is the six
    methods of the single gradient pass: CAM (where the network fits it) and the five
    gradient methods; ``gradients`` is the five gradient methods."""
    wanted: list[str] = []
    methods, groups = base.names(), base.groups()
    for raw, m in _tokens(items):
        if m in groups:
            wanted.extend(groups[m])
        elif m in methods:
            wanted.append(m)
        else:
            from inspect_model.errors import suggest

            raise UsageError(f"--method '{raw}' is not a CAM method" + (suggest(m, list(methods)) or "")
                             + f"; choose from {', '.join(methods)}, all, gradients")
    return [m for m in methods if m in wanted]


def parse_reshape(text: str | None) -> tuple[int, int] | None:
    """``--reshape 14x14`` to (14, 14)."""
    if text is None:
        return None
    parts = text.lower().replace(",", "x").split("x")
    try:
        h, w = (int(p) for p in parts)
    except ValueError as exc:
        raise UsageError(f"--reshape '{text}' is not HxW, e.g. --reshape 14x14") from exc
    if h < 1 or w < 1:
        raise UsageError(f"--reshape '{text}': both sides must be >= 1")
    return h, w


# ----------------------------------------------------------------------------- entry points
def compute_cams(
    model: nn.Module,
    x: torch.Tensor,
    *,
    layers: Sequence[str | CamLayer] | None = None,
    methods: Sequence[str] = ("gradcam",),
    target: str | TargetSpec | Sequence[int] | Sequence[Sequence[int]] = "predicted",
    output_key: str | None = None,
    reshape: tuple[int, int] | None = None,
    scorecam_batch: int | None = None,
    fuse: bool = False,
    progress: Any = None,
) -> CamResult:
    """Class activation maps of ``methods`` at ``layers`` for the batch ``x`` (N, C, H, W).

    ``layers``: ``None``/``["auto"]``, layer specs, or :class:`CamLayer` records from
    :func:`resolve_layers` (then no probe pass runs). ``target``: ``predicted``, ``top:K``, a
    class index, a :class:`TargetSpec`, or explicit class indices per sample. The model is
    given back as it was (hooks, flags, ``requires_grad``, ``.grad``)."""
    import torch

    model = unwrap_module(model)[0]  # compiled / DataParallel: the module inside (loading/wrappers.py)
    optional_cam = cam_is_optional(list(methods))
    methods = parse_methods(list(methods))
    notes: list[str] = []
    if scorecam_batch is not None and scorecam_batch < 1:
        raise UsageError(f"--scorecam-batch must be 1 or more, got {scorecam_batch}")
    x = x.detach()
    hw = input_dims(x)  # (H, W), or (T, H, W) for clips: maps over time (methods/cam/video.py)
    cam_layers, names = _layers(model, x, layers, reshape, output_key)
    grads = any(base.get(m).needs_gradients for m in methods)
    fc = cp.classifier(model) if any(base.get(m).needs_classifier for m in methods) else None
    passes = {"forward": 0, "backward": 0, "scorecam_forward": 0}

    first, acts, gradients = _capture_all(model, x, names, grads=grads, target=target, output_key=output_key,
                                          fc=fc, passes=passes)
    classes = first.classes
    scores = first.scores.detach()
    bad = ~torch.isfinite(scores.reshape(scores.shape[0], -1)).all(1) if scores.dim() else None
    if bad is not None and bool(bad.any()):
        # Never a silent map: a NaN score makes 'predicted' (argmax) arbitrary (issue 9).
        notes.append(f"the model's output holds NaN or Inf for {int(bad.sum())} of {bad.numel()} image(s): "
                     "scores, probabilities and 'predicted' targets are meaningless there")
    if cam_layers is None:
        cam_layers = [CamLayer(n, infer_layout(model, n, tuple(acts[n].shape), hw, reshape),
                               tuple(acts[n].shape[1:])) for n in names]

    raw_maps: dict[tuple[str, str], torch.Tensor] = {}  # (layer, method) -> (K, N, h, w)
    scales: dict[str, torch.Tensor] = {}  # layer -> (K, N): the terms' size, for the numeric-zero test
    for layer in cam_layers:
        A = cm.to_spatial(acts[layer.name], layer.layout)
        A = A.float() if A.dtype != torch.float64 else A
        if grads:
            scales[layer.name] = torch.stack([cm.term_scale(A, cm.to_spatial(g, layer.layout))
                                              for g in gradients[layer.name]]).cpu()

        def masked_scores(A: torch.Tensor = A) -> torch.Tensor:
            weights, n_pass = cp.scorecam(model, x, A, classes, output_key, scorecam_batch, progress)
            passes["scorecam_forward"] += n_pass
            return weights

        inp = base.MapInputs(
            A, [cm.to_spatial(g, layer.layout) for g in gradients[layer.name]] if grads else None, classes,
            fc_weight=lambda name=layer.name, A=A: cp.check_cam(model, fc, name, A, first),
            masked_scores=masked_scores)
        for m in methods:
            try:
                raw_maps[(layer.name, m)] = base.get(m).maps(inp)
            except UsageError as exc:
                if not (optional_cam and base.get(m).in_all == "if-fits"):
                    raise
                notes.append(f"{m} left out of --method all at layer '{layer.name}': "
                             + str(exc).split(": ", 1)[-1].split("; use --method")[0])
    maps = _records(raw_maps, classes, hw, [layer.name for layer in cam_layers], methods, fuse, scales,
                    first.scores.detach().float().cpu())
    return CamResult(scores=first.scores.float().cpu(), targets=classes.cpu().tolist(),
                     layers=cam_layers, maps=maps, input_hw=hw, passes=passes, notes=notes)


def _layers(model: nn.Module, x: torch.Tensor, layers: Sequence[str | CamLayer] | None,
            reshape: tuple[int, int] | None, output_key: str | None) -> tuple[list[CamLayer] | None, list[str]]:
    """(CamLayer records, or None when the layouts come from the captured shapes; their names)."""
    if layers and all(isinstance(layer, CamLayer) for layer in layers):
        given: list[CamLayer] = list(layers)  # type: ignore[arg-type]
        return given, [layer.name for layer in given]
    if not layers or any(isinstance(s, str) and s.strip().lower() == "auto" for s in layers):
        resolved = resolve_layers(model, x, [str(s) for s in layers or []], reshape, output_key)
        return resolved, [layer.name for layer in resolved]
    from inspect_model.engine.selection import select_layers

    names: list[str] = []  # layouts from the captured shapes: no probe pass
    for s in layers:
        spec = s if isinstance(s, str) else s.name
        plain = not any(ch in spec for ch in "*?[") and not spec.startswith("type:")
        names.extend(select_layers(model, [spec], leaves_only=not plain))
    return None, list(dict.fromkeys(names))


def _capture_all(model: nn.Module, x: torch.Tensor, names: list[str], *, grads: bool, target: Any,
                 output_key: str | None, fc: Any, passes: dict[str, int]) -> tuple[Any, dict[str, Any],
                                                                                     dict[str, list[Any]]]:
    """Activations (and gradients) of every layer in ``names``: layers that do not depend on
    the first one's output get a pass of their own. (first capture, acts, gradients)."""
    acts: dict[str, Any] = {}
    gradients: dict[str, list[Any]] = {}
    remaining, classes, first = list(names), None, None
    while remaining:
        cap, missing = cp.capture(model, x, remaining, grads=grads, target=target, output_key=output_key,
                                  fc=fc if first is None else None, classes=classes)
        passes["forward"] += 1
        passes["backward"] += cap.classes.shape[1] if grads else 0
        first = first or cap
        classes = cap.classes
        acts.update(cap.acts)
        gradients.update(cap.grads)
        remaining = missing
    assert first is not None and classes is not None
    return first, acts, gradients


def _records(raw_maps: dict[tuple[str, str], torch.Tensor], classes: torch.Tensor, hw: tuple[int, ...],
             layer_names: list[str], methods: list[str], fuse: bool,
             scales: dict[str, torch.Tensor] | None = None, scores: torch.Tensor | None = None) -> list[CamMap]:
    import torch

    out: list[CamMap] = []
    n, k = classes.shape
    finished: dict[tuple[str, str], torch.Tensor] = {}
    for (layer, m), raw in raw_maps.items():
        sp = raw.shape[2:]  # (h, w), or (t, h, w)
        fin = cm.finish_maps(raw.reshape(k * n, *sp), hw).reshape(k, n, *hw).cpu()
        finished[(layer, m)] = fin
        raw_cpu = raw.detach().float().cpu()
        gradient_map = base.get(m).needs_gradients and scales and layer in scales
        for i in range(n):
            for j in range(k):
                r = raw_cpu[j, i]
                warns = cm.map_warnings(r, float(scales[layer][j, i]) if gradient_map else None,  # type: ignore[index]
                                        float(scores[i, classes[i, j]]) if gradient_map and scores is not None
                                        else None)
                if cm.is_numeric_zero(warns):
                    fin[j, i] = 0.0  # noise is not stretched to full contrast
                out.append(CamMap(i, j, int(classes[i, j]), m, layer, fin[j, i], r.clone(),
                                  float(r.min()), float(r.max()), warns, base.get(m).class_independent))
    if fuse and len(layer_names) > 1:
        name = "fused:" + "+".join(layer_names)
        for m in methods:
            # As pytorch-grad-cam: the element-wise maximum of the normalised maps, renormalised.
            have = [finished[(layer, m)] for layer in layer_names if (layer, m) in finished]
            if len(have) < 2:
                continue
            stack = torch.stack(have).amax(dim=0)  # (K, N, H, W)
            fused = cm.finish_maps(stack.reshape(k * n, *hw), hw).reshape(k, n, *hw)
            for i in range(n):
                for j in range(k):
                    s = stack[j, i]
                    out.append(CamMap(i, j, int(classes[i, j]), m, name, fused[j, i], None,
                                      float(s.min()), float(s.max()), cm.map_warnings(s),
                                      base.get(m).class_independent))
    order = {m: i for i, m in enumerate(methods)}
    lorder = {n: i for i, n in enumerate(layer_names)}
    out.sort(key=lambda c: (c.sample, c.rank, lorder.get(c.layer, len(lorder)), order[c.method]))
    return out


def gradcam(model: nn.Module, x: torch.Tensor, layer: str,
            class_indices: list[list[int]] | list[int]) -> torch.Tensor:
    """Grad-CAM maps (N, K, H_in, W_in), float32 on ``x``'s device, each map upsampled
    (bilinear) to the input resolution and normalised to [0, 1] (an all-zero map when the
    layer holds no positive evidence).

    ``layer`` is a module name with a (N, C, h, w) or token output; ``class_indices`` gives
    one class per sample (``[3, 7]``: K = 1) or K classes per sample (``[[3, 5], [7, 1]]``).
    One forward pass and K partial backward passes; the model is given back untouched."""
    import torch

    x = x.detach()
    hw = input_dims(x)
    cap, _ = cp.capture(model, x, [layer], grads=True, target=list(class_indices), output_key=None, fc=None)
    layout = infer_layout(model, layer, tuple(cap.acts[layer].shape), hw)
    A = cm.to_spatial(cap.acts[layer], layout).float()
    weigh = base.get("gradcam").weigh  # type: ignore[attr-defined]
    raw = torch.stack([weigh(A, cm.to_spatial(g, layout).float())
                       for g in cap.grads[layer]], dim=1)  # (N, K, h, w)
    n, k = raw.shape[:2]
    return cm.finish_maps(raw.reshape(n * k, *raw.shape[2:]), hw).reshape(n, k, *hw)
