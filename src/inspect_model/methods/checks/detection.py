"""``check`` on detectors: their output is a list of ``{"boxes", "labels", "scores"}`` dicts
(torchvision; Mask R-CNN adds ``masks``, Keypoint R-CNN ``keypoints``), one per image, with
a different number of detections in each. :func:`detection_output_check` checks every one:
shapes (boxes (K, 4), labels (K,), scores (K,), masks (K, 1, H, W), keypoints (K, P, 3)),
integer labels, finite boxes, scores and masks, scores in [0, 1] and boxes with x0 <= x1,
y0 <= y1 (issue 24).
"""

from __future__ import annotations

from typing import Any


def is_detection_output(out: Any) -> bool:
    return isinstance(out, (list, tuple)) and bool(out) and all(
        isinstance(d, dict) and {"boxes", "labels", "scores"} <= set(d) for d in out)


def _problems(i: int, d: dict[str, Any]) -> list[str]:
    import torch

    d = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in d.items()}
    b, lab, s = d["boxes"], d["labels"], d["scores"]
    k = int(b.shape[0]) if b.dim() >= 1 else -1
    out = []
    if b.dim() != 2 or b.shape[-1] != 4:
        out.append(f"image {i}: boxes are {tuple(b.shape)}, not (K, 4)")
    if tuple(lab.shape) != (k,) or tuple(s.shape) != (k,):
        out.append(f"image {i}: labels {tuple(lab.shape)} and scores {tuple(s.shape)} do not match {k} boxes")
    if lab.is_floating_point():
        out.append(f"image {i}: labels are {str(lab.dtype).replace('torch.', '')}, not integers")
    for name in ("boxes", "scores", "masks", "keypoints"):
        t = d.get(name)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            out.append(f"image {i}: {int((~torch.isfinite(t)).sum())} non-finite value(s) in {name}")
    if s.numel() and (float(s.min()) < 0 or float(s.max()) > 1):
        out.append(f"image {i}: scores outside [0, 1] ({float(s.min()):.3g}..{float(s.max()):.3g})")
    if b.dim() == 2 and b.shape[-1] == 4 and b.numel() and bool(((b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1])).any()):
        out.append(f"image {i}: boxes with x1 < x0 or y1 < y0")
    masks, kps = d.get("masks"), d.get("keypoints")
    if isinstance(masks, torch.Tensor) and (masks.dim() != 4 or masks.shape[0] != k):
        out.append(f"image {i}: masks are {tuple(masks.shape)}, not (K, 1, H, W)")
    if isinstance(kps, torch.Tensor) and (kps.dim() != 3 or kps.shape[0] != k or kps.shape[-1] != 3):
        out.append(f"image {i}: keypoints are {tuple(kps.shape)}, not (K, P, 3)")
    return out


def detection_output_check(out: Any) -> tuple[bool, int, str] | None:
    """The check of a detector's list-of-dicts output (passed, problem count, detail; the
    caller makes it a ``CheckResult``), or None for any other output."""
    if not is_detection_output(out):
        return None
    problems = [p for i, d in enumerate(out) for p in _problems(i, d)]
    total = sum(int(d["scores"].shape[0]) for d in out if d["scores"].dim() == 1)
    detail = ("; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")) if problems \
        else f"{len(out)} image(s), {total} detection(s): boxes (K, 4), labels (K,), scores (K,) in [0, 1], finite"
    return not problems, len(problems), detail
