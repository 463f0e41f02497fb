"""The rows of an objective (:mod:`.objectives`): :class:`Row` (what one score is: sample,
class, a detection's box and confidence, a mask's area), :class:`Selection` (a batch's rows),
the dense tasks' ``--target`` (:class:`TaskTarget`) and class-name helpers. Apart from
:mod:`.objectives` so that the task modules (:mod:`.detection`, :mod:`.segmentation`) and the
factory that picks them import no circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch

    from inspect_model.loading.geometry import PictureFrame

Box = tuple[float, float, float, float]


@dataclass
class Row:
    """One score to explain: one image, one target."""

    sample: int
    rank: int  # 0-based position among the sample's rows
    label: int  # class index
    name: str | None  # class name, when the model names its classes
    score: float  # the objective's value (what is differentiated)
    box: list[float] | None = None  # detection: its box (x0, y0, x1, y1), model-input pixels
    confidence: float | None = None  # detection: the model's score of the detection
    matched_box: list[float] | None = None  # the --boxes box it was matched to (input pixels)
    iou: float | None = None  # IoU of box and matched_box
    area: int | None = None  # segmentation: pixels of the mask scored (output resolution)
    area_fraction: float | None = None
    mask_source: str | None = None  # predicted | box | all | all (class absent)
    mask: Any = None  # segmentation: (H_in, W_in) bool, the predicted mask outlined in pictures
    scored_mask: Any = None  # segmentation: (h, w) bool, the pixels scored (output resolution)
    notes: list[str] = field(default_factory=list)

    def record(self, frame: PictureFrame | None = None) -> dict[str, Any]:
        """The JSON form (no tensors). Boxes in model-input pixels, and beside each the same
        box on the original picture through ``frame`` (``image_box``, ``matched_image_box``,
        ``image_region``: null when no picture is known, a tensor input)."""
        def pic(box: list[float] | None) -> list[float] | None:
            return frame.to_picture(box) if frame is not None else None

        out: dict[str, Any] = {"class": self.label, "label": self.name, "score": self.score}
        if self.confidence is not None:
            out.update(box=self.box, confidence=self.confidence, matched_box=self.matched_box, iou=self.iou,
                       image_box=pic(self.box), matched_image_box=pic(self.matched_box))
        if self.mask_source is not None:
            out.update(area=self.area, area_fraction=self.area_fraction, mask_source=self.mask_source,
                       region=self.box, image_region=pic(self.box))
        return out


@dataclass
class Selection:
    """What an objective read from one forward pass."""

    scores: Any  # (R,) differentiable, in row order
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    per_sample: list[dict[str, Any]] = field(default_factory=list)  # legend / detections per sample
    class_maps: list[Any] = field(default_factory=list)  # segmentation: (h, w) predicted classes per sample
    detections: list[list[tuple[list[float], int, float]]] = field(default_factory=list)  # all kept, per sample

    def ranks(self) -> int:
        return max((r.rank + 1 for r in self.rows), default=0)

    def rank_sum(self, j: int) -> torch.Tensor | None:
        """The sum of the scores of rank ``j`` over the samples (samples are independent, so
        one backward of the sum gives each sample its own gradient)."""
        picks = [i for i, r in enumerate(self.rows) if r.rank == j]
        return self.scores[picks].sum() if picks else None


@dataclass(frozen=True)
class TaskTarget:
    """A parsed ``--target`` for a detector or a segmenter."""

    kind: str  # "predicted", "top", "class"
    index: int | None = None
    k: int = 0  # top:K
    whole: bool = False  # CLASS@all: the whole image (segmentation)
    text: str = "predicted"


def parse_task_target(text: str | None, categories: Sequence[str] | None, task: str) -> TaskTarget:
    """``predicted``, ``top:K``, ``CLASS`` (index or name), or ``CLASS@all`` (segmentation)."""
    from inspect_model.methods.objectives.targets import parse_target

    raw = (text or "predicted").strip()
    whole = raw.lower().endswith("@all")
    head = raw[:-4].strip() if whole else raw
    if whole and task != "segmentation":
        raise UsageError(f"--target '{raw}': CLASS@all (the whole image) is for segmentation models")
    spec = parse_target(head, categories)
    if whole and spec.kind != "class":
        raise UsageError(f"--target '{raw}': @all follows a class index or name, e.g. 15@all")
    if spec.kind == "predicted" and head.lower() in ("top", "top:1"):  # the best one, not every one
        return TaskTarget("top", k=1, text=raw)
    return TaskTarget(spec.kind, index=spec.index, k=spec.k, whole=whole, text=raw)


def check_class(index: int, n_classes: int, categories: Sequence[str] | None) -> None:
    if not 0 <= index < n_classes:
        raise InputError(f"--target {index} is out of range: the model has {n_classes} classes "
                         f"(0..{n_classes - 1})")


def is_objective(categories: Sequence[str] | None) -> bool:
    """Whether the scores are one named objective (a text model's ``log p(...)``, an
    embedding's norm: ``TaskLabels(objective=True)``) rather than classes."""
    return bool(getattr(categories, "objective", False))


def objective_flag(categories: Sequence[str] | None) -> dict[str, Any]:
    """A target record's ``objective`` keyword: ``{"objective": True}`` for a named objective, else none."""
    return {"objective": True} if is_objective(categories) else {}


def target_fields(index: int, categories: Sequence[str] | None) -> dict[str, Any]:
    """A target dict's ``class`` and ``label``, and ``objective: true`` for a named objective."""
    return {"class": index, "label": class_name(index, categories), **objective_flag(categories)}


def class_name(index: int, categories: Sequence[str] | None) -> str | None:
    if categories and 0 <= index < len(categories) and categories[index]:
        return str(categories[index])
    return None
