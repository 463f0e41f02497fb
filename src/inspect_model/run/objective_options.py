"""What the gradient commands share about a detector's or segmenter's target (issue 24)."""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError


def one_target(prep: Any, target: Any) -> Any:
    """``target`` as the objective of a detector or segmenter takes it: one for every image.
    A per-sample list (the API's) is refused there; any other model gets it unchanged."""
    if not isinstance(target, tuple):
        return target
    from inspect_model.methods.objectives.tasks import infer_task

    task = infer_task(prep.loaded.model, prep.loaded)
    if task in ("detection", "segmentation"):
        raise UsageError(f"a {task} model takes one --target for every image, not one per sample")
    return target
