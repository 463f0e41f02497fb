"""The segmentation objective: a class's logits summed over its mask.

pytorch-grad-cam's ``SemanticSegmentationTarget(category, mask)`` scores
``(model_output[category, :, :] * mask).sum()``; here the mask is the pixels predicted as
that class (the argmax over classes), limited to a ``--boxes`` region when one is given, or
every pixel for ``CLASS@all``. When no pixel is predicted as the class, the map is made over
every pixel (of the region) and a note says so. ``predicted`` explains every class present,
largest area first; ``top:K`` the K largest.

Outputs read: torchvision's ``{"out": (N, classes, H, W), "aux": ...}`` and Hugging Face's
``logits`` (N, classes, h, w) (SegFormer predicts at a quarter of the input resolution);
areas are counted at the output's resolution, boxes scaled to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelRuntimeError
from inspect_model.methods.objectives.rows import Row, Selection, TaskTarget, check_class, class_name

if TYPE_CHECKING:
    import torch


def segmentation_logits(output: Any) -> torch.Tensor:
    """The (N, classes, h, w) logits of a segmenter's output."""
    import torch

    if isinstance(output, torch.Tensor):
        t = output
    elif isinstance(output, dict) and "out" in output:
        t = output["out"]
    elif getattr(output, "logits", None) is not None:
        t = output.logits
    elif isinstance(output, dict) and "logits" in output:
        t = output["logits"]
    else:
        raise ModelRuntimeError(f"the segmentation model's output ({type(output).__name__}) has no 'out' "
                                "or 'logits' tensor")
    if t.dim() != 4:
        raise ModelRuntimeError(f"segmentation logits must be (N, classes, h, w), got {tuple(t.shape)}")
    return t


def box_mask(box: Sequence[float], input_hw: tuple[int, int], out_hw: tuple[int, int]) -> torch.Tensor:
    """(h, w) bool: the output pixels whose centres lie in ``box`` (input pixels)."""
    import torch

    H, W = input_hw
    h, w = out_hw
    ys = (torch.arange(h, dtype=torch.float64) + 0.5) * (H / h)
    xs = (torch.arange(w, dtype=torch.float64) + 0.5) * (W / w)
    x0, y0, x1, y1 = box
    return ((ys >= y0) & (ys <= y1))[:, None] & ((xs >= x0) & (xs <= x1))[None, :]


class SegmentationObjective:
    """Rows = classes' mask scores (see the module docstring)."""

    task = "segmentation"

    def __init__(self, spec: TaskTarget, categories: Sequence[str] | None) -> None:
        self.spec, self.categories = spec, categories
        self.boxes: list[list[tuple[tuple[float, ...], int | None]]] | None = None

    def scoring(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def probability(self, out: Any, x: torch.Tensor, rows: Sequence[Row]) -> list[float]:
        """``cam --evaluate``: per input, the class's mean softmax probability over the mask
        its map explains (the same target, as a probability)."""
        probs = segmentation_logits(out).detach().float().softmax(1)  # (B, classes, h, w)
        return [float(probs[b, r.label][r.scored_mask.to(probs.device)].mean()) for b, r in enumerate(rows)]

    def describe(self) -> str:
        return (f"sum over targets '{self.spec.text}' of the class's logits summed over its predicted mask "
                "(pytorch-grad-cam's SemanticSegmentationTarget)")

    def note_empty(self, model: Any, x: Any, sel: Selection, names: Sequence[str]) -> None:
        """Every image has a predicted class: nothing to remember."""

    def empty_warning(self) -> str | None:
        return None

    def context(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def select(self, output: Any, x: torch.Tensor) -> Selection:
        import torch
        import torch.nn.functional as F

        logits = segmentation_logits(output)
        n, c, h, w = logits.shape
        in_hw = (int(x.shape[-2]), int(x.shape[-1]))
        pred = logits.detach().argmax(1)  # (N, h, w)
        rows: list[Row] = []
        picked: list[Any] = []
        notes: list[str] = []
        per_sample = []
        for i in range(n):
            counts = torch.bincount(pred[i].flatten(), minlength=c)  # (classes,)
            present = [int(k) for k in counts.argsort(descending=True, stable=True) if int(counts[k]) > 0]
            per_sample.append({"classes": [{"class": k, "label": class_name(k, self.categories),
                                            "area": int(counts[k]), "area_fraction": float(counts[k]) / (h * w)}
                                           for k in present]})
            region = None
            named = self.boxes[i] if self.boxes is not None and i < len(self.boxes) else None
            if named:
                region = torch.zeros(h, w, dtype=torch.bool)
                for nb, _ in named:
                    region |= box_mask(nb, in_hw, (h, w))
                region = region.to(logits.device)
            for rank, k in enumerate(self._classes(present, c)):
                if self.spec.whole:
                    mask = region if region is not None else torch.ones(h, w, dtype=torch.bool, device=logits.device)
                    source = "box" if region is not None else "all"
                else:
                    mask = pred[i] == k
                    source = "predicted"
                    if region is not None:
                        mask, source = mask & region, "predicted in box"
                    if not bool(mask.any()):
                        mask = region if region is not None else torch.ones_like(mask)
                        source = "all (class absent)"
                        where = "in the box" if region is not None else "in the image"
                        notes.append(f"image {i}: no pixel {where} is predicted as class "
                                     f"{k}{' ' + (class_name(k, self.categories) or '')}; its map is made over "
                                     f"every pixel {where}")
                # pytorch-grad-cam's SemanticSegmentationTarget: (output[c] * mask).sum()
                s = (logits[i, k] * mask.to(logits.dtype)).sum()
                shown = F.interpolate((pred[i] == k)[None, None].float(), size=in_hw, mode="nearest")[0, 0] > 0.5
                area = int(mask.sum())
                rows.append(Row(i, rank, k, class_name(k, self.categories), float(s.detach()), area=area,
                                area_fraction=area / (h * w), mask_source=source, mask=shown.cpu(),
                                scored_mask=mask.detach().cpu(),
                                box=[float(v) for v in named[0][0]] if named and len(named) == 1 else None))
                picked.append(s)
        return Selection(torch.stack(picked) if picked else torch.zeros(0), rows, notes, per_sample,
                         class_maps=[p.cpu() for p in pred])

    def _classes(self, present: list[int], n_classes: int) -> list[int]:
        spec = self.spec
        if spec.kind == "class" and spec.index is not None:
            check_class(spec.index, n_classes, self.categories)
            return [spec.index]
        if spec.kind == "top":
            return present[: spec.k]
        return present
