"""Guided backpropagation of detections and segmentation targets (issue 24).

The same guided backward pass as :func:`~.guided.guided_backprop`, differentiating the rows
of an objective (:mod:`.objectives`) instead of one-hot class scores: one backward pass per
row rank, the rows of that rank summed over the batch (samples are independent). Samples
have as many maps as they have rows (a detector finds a different number of objects in
each image); the gradient tensor is padded with zeros to the largest count.
"""

from __future__ import annotations

from typing import Any

import torch

from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
from inspect_model.errors import ModelRuntimeError


def dense_guided(model: torch.nn.Module, inputs: torch.Tensor, objective: Any, kinds: tuple[str, ...]) -> Any:
    """A :class:`~.guided.GuidedResult` whose ``rows`` say what each map explains."""
    from inspect_model.methods.guided.backprop import GuidedBackwardMode, GuidedResult, _no_guided_warning

    opts = CaptureOptions(outputs=False, freeze_params=True, eval_mode=True, grad_enabled=True)
    n = int(inputs.shape[0])
    with HookEngine(model, [], opts) as engine, objective.context():
        leaf = inputs.detach().requires_grad_(True)
        out = run_forward(engine, lambda: model(leaf.clone()))
        sel = objective.select(out, inputs)
        ranks = sel.ranks()
        grads = torch.zeros(n, ranks, *inputs.shape[1:], dtype=torch.float32)
        sites: dict[str, int] = {}
        unguided: dict[str, int] = {}
        if ranks and not sel.scores.requires_grad:
            raise ModelRuntimeError(f"the {objective.task} scores do not depend on the input; nothing to backpropagate")
        for k in range(ranks):
            total = sel.rank_sum(k)
            mode = GuidedBackwardMode(kinds)
            try:
                with mode:
                    (g,) = torch.autograd.grad(total, leaf, retain_graph=k < ranks - 1, allow_unused=True)
            except RuntimeError as exc:
                msg = (str(exc).strip().splitlines() or [""])[0]
                raise ModelRuntimeError(f"backward pass failed: {type(exc).__name__}: {msg}") from exc
            if k == 0:
                sites = dict(sorted(mode.guided.items()))
                unguided = dict(sorted((kd, c) for kd, c in mode.seen.items() if kd not in mode.kinds))
            if g is not None:
                has = [r.sample for r in sel.rows if r.rank == k]
                grads[has, k] = g.detach().float().cpu()[has]
    rows = sel.rows
    result = GuidedResult(
        gradients=grads,
        targets=[[r.label for r in rows if r.sample == i] for i in range(n)],
        scores=[[r.score for r in rows if r.sample == i] for i in range(n)],
        sites=sites, unguided=unguided, kinds=kinds)
    result.rows = rows
    result.warnings.extend(sel.notes)
    if ranks and not result.sites:
        result.warnings.append(_no_guided_warning(kinds, result.unguided))
    return result


def dense_gradcam(model: torch.nn.Module, x: torch.Tensor, objective: Any, layer: str, res: Any) -> tuple[str, Any]:
    """Grad-CAM maps (N, K, H, W) of the same rows as ``res`` (guided Grad-CAM), at
    ``layer`` (``auto``: the task's default layer), and the layer's name."""
    from inspect_model.methods.cam.tasks import compute_task_cams
    from inspect_model.methods.objectives.tasks import task_auto_layer

    name = task_auto_layer(model, objective.task) if layer.strip().lower() == "auto" else layer
    if name is None:
        raise ModelRuntimeError(f"no default map layer is known for {type(model).__name__}; pass --layer NAME")
    cams = compute_task_cams(model, x, objective, name, ["gradcam"])
    maps = torch.zeros(res.gradients.shape[0], res.gradients.shape[1], *x.shape[-2:])
    for m in cams.maps:
        maps[m.row.sample, m.row.rank] = m.map
    return name, maps
