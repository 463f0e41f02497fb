"""The detection objective: one score per detection, as pytorch-grad-cam's
``FasterRCNNBoxScoreTarget`` defines it.

A detection's score is its confidence, plus the IoU of its box with a box named in
``--boxes`` when one is named (then the map explains "this box, as this detection"). Every
detection at or above ``--score-threshold`` is a row, highest first, up to
``--max-detections``; ``--target CLASS`` keeps that class's detections; ``--boxes`` names the
boxes to explain, each matched to the detection of the same class (any class when the box
names none) with the highest IoU.

Outputs read: torchvision's list of ``{"boxes", "labels", "scores"}`` dicts (R-CNNs,
RetinaNet, FCOS, SSD; boxes in model-input pixels) and Hugging Face's DETR-style
``logits`` (N, queries, classes + 1, the last "no object") with ``pred_boxes`` (N, queries,
4) as normalised (cx, cy, w, h). In eval mode with grad enabled, the scores and boxes stay
on the autograd graph, so gradient methods reach the feature maps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelRuntimeError
from inspect_model.methods.objectives.rows import Row, Selection, TaskTarget, check_class, class_name

if TYPE_CHECKING:
    import torch
    from torch import nn

HF_DEFAULT_THRESHOLD = 0.5  # DETR-style models have no threshold of their own (HF's post-processing default)


def _threshold_owner(model: nn.Module) -> tuple[Any, str] | None:
    """The object and attribute of a torchvision detector's post-processing threshold."""
    roi = getattr(model, "roi_heads", None)
    if roi is not None and hasattr(roi, "score_thresh"):
        return roi, "score_thresh"  # Faster/Mask/Keypoint R-CNN
    if hasattr(model, "score_thresh"):
        return model, "score_thresh"  # RetinaNet, FCOS, SSD, SSDlite
    return None


def model_threshold(model: nn.Module) -> float:
    owner = _threshold_owner(model)
    return float(getattr(*owner)) if owner is not None else HF_DEFAULT_THRESHOLD


@contextlib.contextmanager
def score_threshold(model: nn.Module, value: float | None) -> Iterator[float]:
    """Set the model's own post-processing threshold to ``value`` for the run (None: keep
    it) and give it back afterwards, also on failure. Yields the threshold in force."""
    owner = _threshold_owner(model)
    if owner is None or value is None:
        yield model_threshold(model) if value is None else value
        return
    obj, attr = owner
    old = getattr(obj, attr)
    setattr(obj, attr, float(value))
    try:
        yield float(value)
    finally:
        setattr(obj, attr, old)


def read_detections(output: Any, input_hw: tuple[int, int]) -> list[tuple[Any, Any, Any]]:
    """Per sample ``(boxes (K, 4) xyxy in input pixels, labels (K,), scores (K,))``."""
    import torch

    if isinstance(output, (list, tuple)) and output and all(isinstance(d, dict) for d in output):
        out = []
        for d in output:
            if not {"boxes", "labels", "scores"} <= set(d):
                raise ModelRuntimeError(f"a detection output needs boxes, labels and scores; got {sorted(d)}")
            out.append((d["boxes"], d["labels"], d["scores"]))
        return out
    logits = getattr(output, "logits", None) if not isinstance(output, dict) else output.get("logits")
    pred = getattr(output, "pred_boxes", None) if not isinstance(output, dict) else output.get("pred_boxes")
    if isinstance(logits, torch.Tensor) and isinstance(pred, torch.Tensor) and logits.dim() == 3:
        probs = logits.float().softmax(-1)[..., :-1]  # the last class is "no object"
        scores, labels = probs.max(-1)  # (N, Q)
        h, w = input_hw
        cx, cy, bw, bh = pred.float().unbind(-1)
        boxes = torch.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h], -1)
        return [(boxes[i], labels[i], scores[i]) for i in range(logits.shape[0])]
    raise ModelRuntimeError(f"the detector's output ({type(output).__name__}) is neither a list of "
                            "{boxes, labels, scores} dicts nor DETR-style logits + pred_boxes")


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU (A, B) of boxes a (A, 4) and b (B, 4), xyxy; differentiable in both."""
    import torch

    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp_min(1e-9)


class DetectionObjective:
    """Rows = detections (see the module docstring)."""

    task = "detection"

    def __init__(self, model: nn.Module, spec: TaskTarget, categories: Sequence[str] | None, *,
                 score_threshold: float | None, max_detections: int = 10) -> None:
        self.model, self.spec, self.categories = model, spec, categories
        self.threshold = model_threshold(model) if score_threshold is None else float(score_threshold)
        self.requested = score_threshold
        self.max_detections = max_detections
        self.boxes: list[list[tuple[tuple[float, ...], int | None]]] | None = None
        self.empty: list[tuple[str, float | None]] = []  # (image, best score) of images with no row

    def note_empty(self, model: nn.Module, x: torch.Tensor, sel: Selection, names: Sequence[str]) -> None:
        """Remember the images of this batch with no detection to explain, and their best
        score at any threshold (for :meth:`empty_warning`)."""
        for i, name in enumerate(names):
            if any(r.sample == i for r in sel.rows):
                continue
            best = sel.per_sample[i]["best_score"] if i < len(sel.per_sample) else None
            if best is None or best < self.threshold:
                best = self.best_below(model, x[i:i + 1])
            self.empty.append((str(name), best))

    def empty_warning(self) -> str | None:
        """One warning for every image in which nothing passed the threshold."""
        if not self.empty:
            return None
        from pathlib import Path

        scored = [(n, b) for n, b in self.empty if b is not None]
        best = max(scored, key=lambda nb: nb[1]) if scored else None
        what = f"best score {best[1]:.4g} in {Path(best[0]).name}" if best else "the model detected nothing"
        hint = f"; lower --score-threshold (e.g. {best[1] * 0.9:.3g}) to explain it" if best else ""
        return (f"no detection at or above --score-threshold {self.threshold:g} in {len(self.empty)} "
                f"image(s) ({what}){hint}")

    def scoring(self) -> Any:
        """``cam --evaluate`` reads perturbed inputs with the threshold at 0: a detection's
        score then fades instead of vanishing at the threshold."""
        return score_threshold(self.model, 0.0 if _threshold_owner(self.model) is not None else None)

    def probability(self, out: Any, x: torch.Tensor, rows: Sequence[Row]) -> list[float]:
        """``cam --evaluate``: per input, the score of the detection of the row's class whose
        box overlaps the row's box most (IoU >= 0.5, as FasterRCNNBoxScoreTarget), else 0."""
        import torch

        dets = read_detections(out, (int(x.shape[-2]), int(x.shape[-1])))
        got = []
        for (boxes, labels, scores), row in zip(dets, rows):
            same = labels.detach() == row.label
            if not bool(same.any()) or row.box is None:
                got.append(0.0)
                continue
            ious = box_iou(torch.tensor([row.box], dtype=torch.float32, device=boxes.device),
                           boxes.detach().float()[same])[0]
            best = int(ious.argmax())
            got.append(float(scores.detach()[same][best]) if float(ious[best]) >= 0.5 else 0.0)
        return got

    def describe(self) -> str:
        return (f"sum over detections scoring >= {self.threshold:g} (at most {self.max_detections} per image) of "
                "the detection's score, plus its IoU with the --boxes box it was matched to "
                "(pytorch-grad-cam's FasterRCNNBoxScoreTarget)")

    def context(self) -> Any:
        """The model's threshold set for the run."""
        return score_threshold(self.model, self.requested)

    def select(self, output: Any, x: torch.Tensor) -> Selection:
        import torch

        hw = (int(x.shape[-2]), int(x.shape[-1]))
        dets = read_detections(output, hw)
        rows: list[Row] = []
        picked: list[Any] = []
        notes: list[str] = []
        per_sample: list[dict[str, Any]] = []
        kept: list[list[tuple[list[float], int, float]]] = []
        for i, (boxes, labels, scores) in enumerate(dets):
            keep = torch.nonzero(scores.detach() >= self.threshold).flatten()
            if self.spec.kind == "class" and self.spec.index is not None:
                check_class(self.spec.index, self._n_classes(output), self.categories)
                keep = keep[labels[keep] == self.spec.index]
            order = keep[scores.detach()[keep].argsort(descending=True)]
            named = self.boxes[i] if self.boxes is not None and i < len(self.boxes) else None
            if named:
                chosen = self._match(boxes, labels, order, named, i, notes)
            else:
                limit = self.spec.k if self.spec.kind == "top" else self.max_detections
                chosen = [(int(j), None) for j in order[:min(limit, self.max_detections)]]
            best = float(scores.detach().max()) if scores.numel() else None
            per_sample.append({"detections": int(order.numel()), "best_score": best})
            kept.append([([float(v) for v in boxes[j].detach()], int(labels[j]), float(scores[j].detach()))
                         for j in order[:100].tolist()])
            for rank, (j, nb) in enumerate(chosen):
                s = scores[j]
                row = Row(i, rank, int(labels[j]), class_name(int(labels[j]), self.categories), 0.0,
                          box=[float(v) for v in boxes[j].detach()], confidence=float(s.detach()))
                if nb is not None:
                    iou = box_iou(torch.tensor([nb], dtype=boxes.dtype, device=boxes.device), boxes[j:j + 1])[0, 0]
                    s = s + iou  # FasterRCNNBoxScoreTarget: IoU with the named box + the score
                    row.matched_box, row.iou = [float(v) for v in nb], float(iou.detach())
                row.score = float(s.detach())
                rows.append(row)
                picked.append(s.reshape(()))
        scores_t = torch.stack(picked) if picked else torch.zeros(0)
        return Selection(scores_t, rows, notes, per_sample, detections=kept)

    def _n_classes(self, output: Any) -> int:
        """The detector's class count (background included for the R-CNNs and SSD, whose
        labels index it so), for ``--target`` range checks."""
        logits = getattr(output, "logits", None)
        if logits is not None:
            return int(logits.shape[-1]) - 1  # DETR-style: the last class is "no object"
        predictor = getattr(getattr(self.model, "roi_heads", None), "box_predictor", None)
        if predictor is not None and hasattr(predictor, "cls_score"):
            return int(predictor.cls_score.out_features)  # R-CNNs
        head = getattr(getattr(self.model, "head", None), "classification_head", None)
        for attr in ("num_classes", "num_columns"):  # RetinaNet and FCOS; SSD and SSDlite
            if head is not None and hasattr(head, attr):
                return int(getattr(head, attr))
        if self.categories:
            return len(self.categories)
        return 1 << 30  # unknown: any index is accepted, and matches nothing if absent

    def _match(self, boxes: Any, labels: Any, order: Any, named: list[tuple[tuple[float, ...], int | None]],
               i: int, notes: list[str]) -> list[tuple[int, tuple[float, ...] | None]]:
        """Each named box to the same-class detection of highest IoU (among those kept)."""
        import torch

        out: list[tuple[int, tuple[float, ...] | None]] = []
        for nb, lab in named:
            cand = order if lab is None else order[labels[order] == lab]
            if cand.numel() == 0:
                notes.append(f"image {i}: no detection{'' if lab is None else f' of class {lab}'} at or above "
                             f"the threshold for box {list(nb)}")
                continue
            ious = box_iou(torch.tensor([nb], dtype=boxes.dtype, device=boxes.device), boxes[cand].detach())[0]
            best = int(ious.argmax())
            if float(ious[best]) <= 0:
                notes.append(f"image {i}: no detection overlaps box {list(nb)}")
                continue
            out.append((int(cand[best]), nb))
        return out[: self.max_detections]

    def best_below(self, model: nn.Module, x: torch.Tensor) -> float | None:
        """The best detection score at any threshold (one no-grad pass with the model's
        threshold at 0): what the warning names when nothing passes."""
        import torch

        from inspect_model.engine.hooks import paused_hooks

        # Hooks paused: inside `grads` this pass must not count as a batch.
        with score_threshold(model, 0.0 if _threshold_owner(model) is not None else None), torch.no_grad(), \
                paused_hooks():
            out = model(x)
        dets = read_detections(out, (int(x.shape[-2]), int(x.shape[-1])))
        best = [float(s.max()) for _, _, s in dets if s.numel()]
        return max(best) if best else None
