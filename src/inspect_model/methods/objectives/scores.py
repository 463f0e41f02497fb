"""Objectives: the scalar scores a gradient command explains, one per (image, target) row.

Every gradient command (``cam``, ``grads``, ``guided-backprop``) turns the model's raw output
into a tensor of scores (R,), differentiable, plus one :class:`Row` of metadata per score:
which sample, which class, the detection's box and confidence, the box named in ``--boxes``
it was matched to, the segmentation mask's area and where the mask came from. A class score
of a classifier is the one-hot of today (kept in :mod:`.targets`); a detector's rows are
its detections (:mod:`.detection`), a segmenter's rows its classes' mask scores
(:mod:`.segmentation`). :func:`make_objective` picks the one for a model's task.

Targets of the dense tasks (``--target``): ``predicted`` (every detection / every class
present), ``top:K`` (the K best detections / the K largest classes), a class index or name
(that class's detections / that class's mask), and for segmentation ``CLASS@all`` (the
class's logits summed over the whole image).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inspect_model.errors import UsageError
from inspect_model.methods.objectives.rows import (  # re-exported: the rows are part of this API
    Box,
    Row,
    Selection,
    TaskTarget,
    check_class,
    class_name,
    parse_task_target,
)

__all__ = ["Box", "Row", "Selection", "TaskTarget", "check_class", "check_dense_options", "class_name",
           "make_objective", "objective_seed", "parse_task_target", "task_objective"]


def make_objective(task: str, model: Any, target: str | None, categories: Sequence[str] | None, *,
                   score_threshold: float | None = None, max_detections: int = 10,
                   boxes: Any = None) -> Any:
    """The objective of ``task`` (``detection`` or ``segmentation``) for ``--target``."""
    spec = parse_task_target(target, categories, task)
    if task == "detection":
        from inspect_model.methods.objectives.detection import DetectionObjective

        return DetectionObjective(model, spec, categories, score_threshold=score_threshold,
                                  max_detections=max_detections)
    if task == "segmentation":
        from inspect_model.methods.objectives.segmentation import SegmentationObjective

        return SegmentationObjective(spec, categories)
    raise ValueError(f"no objective for task {task!r}")


def check_dense_options(score_threshold: float | None, max_detections: int) -> None:
    """``--score-threshold`` and ``--max-detections``, checked before anything loads."""
    if score_threshold is not None and not 0.0 <= score_threshold <= 1.0:
        raise UsageError(f"--score-threshold must be between 0 and 1, got {score_threshold}")
    if max_detections < 1:
        raise UsageError(f"--max-detections must be 1 or more, got {max_detections}")


def task_objective(loaded: Any, target: str | None, categories: Sequence[str] | None, *,
                   score_threshold: float | None = None, max_detections: int = 10,
                   refuse: dict[str, Any] | None = None) -> Any:
    """The objective of a detector or a segmenter (``loaded``: a ``LoadedModel`` or a
    module), or None for any other model (its scores stay the one-hot of a class).
    ``refuse``: options (name -> value given) that have no meaning for a dense task."""
    from inspect_model.methods.objectives.tasks import infer_task

    model = getattr(loaded, "model", loaded)
    task = infer_task(model, loaded)
    if task not in ("detection", "segmentation"):
        return None
    for flag, given in (refuse or {}).items():
        if given:
            raise UsageError(f"{flag} compares class scores of a classifier; a {task} model does not take it")
    check_dense_options(score_threshold, max_detections)
    return make_objective(task, model, target, categories, score_threshold=score_threshold,
                          max_detections=max_detections)


def objective_seed(objective: Any, model: Any, out: Any, x: Any,
                   names: Sequence[str]) -> tuple[Any, Any, list[float], list[list[int]]]:
    """For ``grads``: the scores to walk back from (R,) and their seed (ones: the objective
    is the sum of the rows), each input's objective and the classes of its rows. No row (no
    detection passed the threshold): nothing to walk back from (None, None)."""
    import torch

    from inspect_model.errors import ModelRuntimeError

    sel = objective.select(out, x)
    objective.note_empty(model, x, sel, names)
    n = int(x.shape[0])
    per = [float(sum(r.score for r in sel.rows if r.sample == i)) for i in range(n)]
    used = [[r.label for r in sel.rows if r.sample == i] for i in range(n)]
    if not sel.rows:
        return None, None, per, used
    if not sel.scores.requires_grad:
        raise ModelRuntimeError(f"the {objective.task} scores do not depend on anything that requires grad")
    return sel.scores, torch.ones_like(sel.scores), per, used
