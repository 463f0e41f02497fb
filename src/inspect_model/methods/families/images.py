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


@register_task
class Detection(Task):
    name, family, priority = "detection", "detection", 50
    target_help = "--target predicted, top:K or a class: its detections"

    def claims(self, model: Any, loaded: Any) -> bool:
        return _known(model, loaded) == "detection"


@register_task
class Segmentation(Task):
    name, family, priority = "segmentation", "segmentation", 50
    target_help = "--target predicted, top:K, a class or CLASS@all: its mask score"

    def claims(self, model: Any, loaded: Any) -> bool:
        return _known(model, loaded) == "segmentation"


@register_task
class Video(Task):
    name, family, priority = "video", "video", 50
    takes = "clips"

    def claims(self, model: Any, loaded: Any) -> bool:
        return _known(model, loaded) == "video"


@register_task
class OpticalFlow(Task):
    name, family, priority = "optical_flow", "optical flow", 50
    takes = "image pairs"
    target_help = "the mean flow magnitude (the one target)"

    def claims(self, model: Any, loaded: Any) -> bool:
        return _known(model, loaded) == "optical_flow"


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
