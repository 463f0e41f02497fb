"""``attributions --sanity``: cascading model-parameter randomisation (Adebayo et al.,
"Sanity Checks for Saliency Maps", NeurIPS 2018) for every attribution method.

On a deep copy of the model the top 1, 2, 4, ... layers (output side first) are
re-initialised, every method is run again with the same targets and settings, and each
map is compared with the original one by Spearman rank correlation, of the signed map and
of its magnitude (the channel sum of |map|). A method whose maps stay correlated while
the weights they should depend on are random explains the input, not the model. The
layers and their order, the randomisation and the correlation are those of
``guided-backprop --sanity`` (:mod:`methods.guided`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from inspect_model.errors import ModelRuntimeError
from inspect_model.methods.guided import backprop as gb
from inspect_model.methods.guided import correlations
from inspect_model.methods.attributions.maps import AttributionResult, AttributionSettings, attribute


def _magnitude(m: torch.Tensor) -> torch.Tensor:
    return m.abs().sum(0) if m.dim() >= 2 else m.abs()


def sanity_check(model: torch.nn.Module, inputs: torch.Tensor, reference: AttributionResult,
                 settings: AttributionSettings, *, seed: int = 0, output_key: str | None = None,
                 first_index: int = 0, progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """``{"layers", "seed", "steps": [{"randomized", "down_to", "methods": {method:
    {"spearman": [...], "spearman_abs": [...]}}}]}``, one value per map (image-major, then
    target). The user's model is never modified."""
    twin = copy.deepcopy(model)
    layers = gb.randomisable_layers(twin, inputs if inputs.is_floating_point() else inputs[:1])
    if not layers:
        raise ModelRuntimeError("--sanity: the model has no layer with a weight matrix to randomise")
    modules = dict(twin.named_modules())
    counts = gb.cascade_counts(len(layers))
    steps, done = [], 0
    for step, count in enumerate(counts):
        for i in range(done, count):
            gb._randomise(modules[layers[i]], seed + i)
        done = count
        res = attribute(twin, inputs, reference.targets, settings, output_key=output_key, first_index=first_index)
        per: dict[str, Any] = {}
        for method, ref in reference.maps.items():
            new = res.maps[method]
            rho, rho_abs = [], []
            for n in range(ref.shape[0]):
                for k in range(ref.shape[1]):
                    rho.append(gb.rank_correlation(ref[n, k], new[n, k]))
                    rho_abs.append(gb.rank_correlation(_magnitude(ref[n, k]), _magnitude(new[n, k])))
            per[method] = {"spearman": rho, "spearman_abs": rho_abs}
        steps.append({"randomized": count, "down_to": layers[count - 1], "methods": per})
        if progress is not None:
            progress(step + 1, len(counts), "sanity: randomised models")
    return {"layers": layers, "seed": seed, "steps": steps}


def merge(acc: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """Append the per-map correlations of another batch (same layers and steps)."""
    if acc is None:
        return part
    for dst, src in zip(acc["steps"], part["steps"]):
        for method, vals in src["methods"].items():
            correlations.extend(dst["methods"][method], vals)
    return acc


def finish(acc: dict[str, Any] | None) -> dict[str, Any] | None:
    """Means per step and method (NaN correlations, of constant maps, left out)."""
    if acc is None:
        return None
    for s in acc["steps"]:
        for vals in s["methods"].values():
            correlations.add_means(vals)
    acc["method"] = correlations.METHOD
    return acc
