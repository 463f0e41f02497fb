"""The image tasks (issue 42 moved them onto the task idea): classification, detection,
segmentation, video, optical flow and a single score. Their objectives are the ones the
commands already had (a class score; :mod:`~inspect_model.methods.objectives` for detections
and masks; the flow magnitude of :mod:`~inspect_model.loading.pairs`), so their adapter is
none: the model's output is what is explained."""

from __future__ import annotations

from typing import Any

from inspect_model.methods.families.base import Task, is_hf, register_task


def _known(model: Any, loaded: Any) -> str:
    from inspect_model.methods.objectives.tasks import infer_task

    found = infer_task(model, loaded)
    if found != "classification":
        return found
    said = getattr(loaded, "task", None)
    return str(said) if said in ("video", "optical_flow") else found


@register_task
class ImageClassification(Task):
    name = "image_classification"
    family = "image classification"
    target_help = "--target predicted, a class index or name, or top:K"


class _Inferred(Task):
    """An image task found from the model itself (objectives/tasks.infer_task, or the loader's
    word for video and flow models): it claims a model whose inferred task is its name."""

    priority = 50

    def claims(self, model: Any, loaded: Any) -> bool:
        return _known(model, loaded) == self.name


@register_task
class Detection(_Inferred):
    name, family = "detection", "detection"
    target_help = "--target predicted, top:K or a class: its detections"


@register_task
class Segmentation(_Inferred):
    name, family = "segmentation", "segmentation"
    target_help = "--target predicted, top:K, a class or CLASS@all: its mask score"


@register_task
class Video(_Inferred):
    name, family = "video", "video"
    takes = "clips"


@register_task
class OpticalFlow(_Inferred):
    name, family = "optical_flow", "optical flow"
    takes = "image pairs"
    target_help = "the mean flow magnitude (the one target)"


@register_task
class SingleScore(Task):
    """One score per input (a binary classifier's logit, a regressor): ``--target`` is that
    score, class 0."""

    name, family, priority = "single_score", "single score", 10
    target_help = "the one score (class 0)"

    def claims(self, model: Any, loaded: Any) -> bool:
        cfg = getattr(model, "config", None)
        return is_hf(model) and getattr(cfg, "num_labels", None) == 1 and type(model).__name__.endswith(
            ("ForSequenceClassification", "ForImageClassification"))
