"""What a model does, told from the module itself: ``classification``, ``detection`` or
``segmentation`` (issue 24).

The gradient commands explain different scores for each task: a class score (the one-hot
of today), a detection's score (:mod:`.detection`) or a class's mask score
(:mod:`.segmentation`). A model source may already know the task (``LoadedModel.task``,
or the torchvision registry's family); otherwise it is read from the module's classes:

- torchvision detectors: ``GeneralizedRCNN`` (Faster/Mask/Keypoint R-CNN), ``RetinaNet``,
  ``FCOS``, ``SSD`` (SSDlite too) -> detection;
- torchvision segmenters: ``FCN``, ``DeepLabV3`` (both ``_SimpleSegmentationModel``),
  ``LRASPP`` -> segmentation;
- Hugging Face: ``*ForObjectDetection`` (DETR-style ``logits`` + ``pred_boxes``) ->
  detection, ``*ForSemanticSegmentation`` (logits (N, classes, h, w)) -> segmentation.

The default map layer of each task (``--layer auto``) lives here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

DETECTION_BASES = ("GeneralizedRCNN", "RetinaNet", "FCOS", "SSD")
SEGMENTATION_BASES = ("_SimpleSegmentationModel", "FCN", "DeepLabV3", "LRASPP")
TASKS = ("classification", "detection", "segmentation")


def _mro_names(model: Any) -> set[str]:
    return {c.__name__ for c in type(model).__mro__}


def infer_task(model: nn.Module, loaded: Any = None) -> str:
    """``detection``, ``segmentation`` or ``classification`` (everything else: the one-hot
    of a class score, as before). The module's own class wins; then what the source said."""
    names = _mro_names(model)
    kind = type(model).__name__
    if names & set(DETECTION_BASES) or kind.endswith("ForObjectDetection"):
        return "detection"
    if names & set(SEGMENTATION_BASES) or kind.endswith("ForSemanticSegmentation"):
        return "segmentation"
    for attr in ("task", "family"):
        said = getattr(loaded, attr, None)
        if said in ("detection", "segmentation") and _fits(model, said):
            return str(said)
    return "classification"


def _fits(model: nn.Module, task: str) -> bool:
    """A source's word is taken only for a module the objectives know how to read."""
    names = _mro_names(model)
    if task == "detection":
        return bool(names & set(DETECTION_BASES)) or type(model).__name__.endswith("ForObjectDetection")
    return bool(names & set(SEGMENTATION_BASES)) or type(model).__name__.endswith("ForSemanticSegmentation")


def is_hf(model: nn.Module) -> bool:
    return hasattr(model, "config") and type(model).__module__.startswith("transformers")


def task_auto_layer(model: nn.Module, task: str) -> str | None:
    """``--layer auto`` of a detector or segmenter, or None to fall back to the generic rule.

    - torchvision detectors: the feature pyramid ``backbone.fpn`` (R-CNNs, RetinaNet, FCOS);
      SSD's ``backbone`` (its extra blocks make a pyramid of its own). All levels are kept
      and combined on one grid (:func:`inspect_model.methods.cam.tasks.pyramid_to_grid`).
    - HF DETR-style: ``input_projection`` (the backbone's last stage, projected), a single
      (N, d, h, w) map every query attends to.
    - torchvision segmenters: the backbone's last stage (``backbone.layer4`` for ResNets,
      the last ``backbone.N`` block for MobileNet), never the class-channel ``classifier``.
    - HF segmenters: the encoder's last stage norm (SegFormer) or the last backbone stage.
    """
    modules = dict(model.named_modules())
    if task == "detection":
        if "backbone.fpn" in modules:
            return "backbone.fpn"
        if "backbone" in modules and not is_hf(model):
            return "backbone"
        for name in ("model.input_projection", "input_projection"):
            if name in modules:
                return name
        return None
    if task != "segmentation":
        return None
    backbone = modules.get("backbone")
    if backbone is not None and not is_hf(model):
        children = [n for n, _ in backbone.named_children()]
        return f"backbone.{children[-1]}" if children else "backbone"
    import re

    # SegFormer: the last stage's norm (transformers 5: segformer.stages.N.layer_norm; 4:
    # segformer.encoder.layer_norm.N), patch tokens laid out on the stage's grid.
    norms = [n for n in modules if re.search(r"(encoder\.layer_norm\.\d+|stages\.\d+\.layer_norm)$", n)]
    if norms:
        return norms[-1]
    stages = [n for n in modules if n.rsplit(".", 1)[0].endswith(("encoder.stages", "encoder.layers"))]
    return stages[-1] if stages else None
