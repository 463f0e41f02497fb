"""Preprocessing: image to normalised model input, with the geometry kept for drawing back.

``Preprocess`` turns a PIL image into a normalised tensor (resize, centre crop, to tensor,
normalise) and remembers where the crop came from, so that a map computed on the crop can
be drawn back on the original image (:meth:`Preprocess.uncrop_box`). ``build_preprocess``
resolves the options, a preset (``PRESETS``), the weights' own transforms and the default of
the model's task (``TASK_DEFAULTS``: detectors and segmenters are not fed like classifiers)
into one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch
    from PIL import Image

PRESETS: dict[str, dict[str, Any]] = {
    "imagenet": {"resize": 256, "crop": 224, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)},
    "inception": {"resize": 342, "crop": 299, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)},
    "clip": {"resize": 224, "crop": 224, "mean": (0.4815, 0.4578, 0.4082), "std": (0.2686, 0.2613, 0.2758)},
    "unit": {"resize": None, "crop": None, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)},
}

# What torchvision's detectors and segmenters take when no weights bring their transforms
# (--weights none, a module built in code): their weights' presets. A detector resizes and
# normalises inside the model (GeneralizedRCNNTransform, SSD's too) and takes the whole image
# in [0, 1] (``ObjectDetection``: to tensor, nothing else), so its boxes are in the image's own
# pixels; a segmenter's ``SemanticSegmentation`` resizes the shorter side to 520, keeps the
# whole image (no crop) and normalises with ImageNet's values. A classifier's centre crop
# would cut off part of the picture the boxes and masks are drawn on.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "detection": dict(PRESETS["unit"], source="torchvision detection preset"),
    "segmentation": {"resize": 520, "crop": None, "mean": PRESETS["imagenet"]["mean"],
                     "std": PRESETS["imagenet"]["std"], "source": "torchvision segmentation preset"},
}


def _fit(values: Sequence[float], channels: int) -> list[float]:
    """Per-channel values for ``channels`` channels: as given, or their mean for each."""
    vals = [float(v) for v in values]
    return vals if len(vals) == channels else [sum(vals) / len(vals)] * channels


@dataclass
class Preprocess:
    """Resize (shorter side), centre crop, to tensor, normalise; all recorded for reports."""

    resize: int | None = 256
    crop: int | None = 224
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    interpolation: str = "bilinear"
    source: str = "imagenet preset"
    given: tuple[str, ...] = ()  # "--mean", "--std": values the user gave, which must fit
    squash: bool = False  # resize both sides to `resize` (aspect not kept), as timm/HF processors may

    def describe(self, channels: int | None = None) -> dict[str, Any]:
        """The options as applied to images of ``channels`` channels (a 1-channel model's
        normalisation is the mean of a 3-value preset's)."""
        c = channels or len(self.mean)
        d = {
            "resize": self.resize, "crop": self.crop, "mean": _fit(self.mean, c), "std": _fit(self.std, c),
            "interpolation": self.interpolation, "source": self.source,
        }
        if self.squash:
            d["squash"] = True
        return d

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the resize, as torchvision computes it: the shorter side to
        ``resize``, the longer one ``int(resize * long / short)`` (truncated); both sides
        with ``squash``."""
        if not self.resize:
            return width, height
        if self.squash:
            return self.resize, self.resize
        if width <= height:
            return self.resize, int(self.resize * height / width)
        return int(self.resize * width / height), self.resize

    def geometry(self, width: int, height: int) -> tuple[float, float, float, float, float, float]:
        """(scale_x, scale_y, left, top, crop_w, crop_h), the crop in resized pixels: where the
        crop came from. torchvision's ``center_crop`` starts at ``int(round((side - crop) / 2))``,
        and when the crop is larger it pads ``(crop - side) // 2`` before (a negative start)."""
        rw, rh = self.resized_size(width, height)
        cw, ch = (self.crop, self.crop) if self.crop else (rw, rh)

        def start(side: int, c: int) -> int:
            return -((c - side) // 2) if c > side else int(round((side - c) / 2.0))

        return rw / width, rh / height, float(start(rw, cw)), float(start(rh, ch)), float(cw), float(ch)

    def uncrop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The crop's box (left, top, right, bottom) in original-image pixels. A map over the
        model input covers exactly this box of the original (it may reach outside it), to the
        pixel: the sizes and offsets are torchvision's integers (tests/unit/loading/test_image_boxes.py
        measures them through the real resize and crop)."""
        sx, sy, left, top, cw, ch = self.geometry(width, height)
        return (left / sx, top / sy, (left + cw) / sx, (top + ch) / sy)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        interp = getattr(InterpolationMode, self.interpolation.upper(), InterpolationMode.BILINEAR)
        if self.resize:
            size = [self.resize, self.resize] if self.squash else self.resize
            img = F.resize(img, size, interpolation=interp)
        if self.crop:
            img = F.center_crop(img, [self.crop, self.crop])
        t = F.pil_to_tensor(img).to(torch.float32).div_(255.0)  # (C, H, W)
        c = t.shape[0]
        for opt, vals in (("--mean", self.mean), ("--std", self.std)):
            if opt in self.given and len(vals) not in (1, c):  # a preset's values are averaged
                raise InputError(f"{opt} has {len(vals)} values but the images have {c} channels; "
                                 f"give {c} values (or one for all)")
        return F.normalize(t, _fit(self.mean, c), _fit(self.std, c))


def preprocess_from_weights(transforms: Any) -> Preprocess | None:
    """The :class:`Preprocess` equal to a torchvision weights' transform: ImageClassification
    (resize, crop, normalise), SemanticSegmentation (resize, normalise: no crop) or
    ObjectDetection (to tensor only: the detector resizes and normalises itself)."""
    if transforms is None:
        return None
    if isinstance(transforms, Preprocess):  # timm's and HF's preprocessing, already mapped
        import dataclasses

        return dataclasses.replace(transforms)
    if type(transforms).__name__ == "ObjectDetection":  # no attributes: the whole image in [0, 1]
        p = TASK_DEFAULTS["detection"]
        return Preprocess(resize=None, crop=None, mean=p["mean"], std=p["std"], source="weights transforms")
    crop = getattr(transforms, "crop_size", None)
    resize = getattr(transforms, "resize_size", None)
    mean = getattr(transforms, "mean", None)
    std = getattr(transforms, "std", None)
    segmentation = not hasattr(transforms, "crop_size") and hasattr(transforms, "resize_size")
    if not (crop or segmentation) or mean is None or std is None:
        return None
    interp = getattr(transforms, "interpolation", None)
    return Preprocess(
        resize=int(resize[0]) if resize else None,
        crop=int(crop[0]) if crop else None,
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        interpolation=getattr(interp, "value", "bilinear"),
        source="weights transforms",
    )


def build_preprocess(
    *,
    transforms: Any = None,
    preset: str | None = None,
    resize: int | None = None,
    crop: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    input_hw: int | None = None,
    task: str | None = None,
) -> Preprocess:
    """Explicit options win over a preset, which wins over the weights' own transforms,
    which win over the default of a detection or segmentation ``task`` (``TASK_DEFAULTS``),
    which wins over an ImageNet-style default sized for the model (``input_hw``)."""
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"--preset '{preset}' is not one of {', '.join(PRESETS)}")
    base = preprocess_from_weights(transforms) if preset is None else None
    if base is None and preset is None and task in TASK_DEFAULTS:
        d = TASK_DEFAULTS[task]
        base = Preprocess(resize=d["resize"], crop=d["crop"], mean=tuple(d["mean"]), std=tuple(d["std"]),
                          source=d["source"])
    if base is None:
        p = dict(PRESETS[preset or "imagenet"])
        if preset is None and input_hw and input_hw != 224:
            p["crop"] = input_hw
            p["resize"] = round(input_hw * 256 / 224)
        base = Preprocess(resize=p["resize"], crop=p["crop"], mean=tuple(p["mean"]), std=tuple(p["std"]),
                          source=f"{preset or 'imagenet'} preset")
    if resize is not None:
        if resize < 1:
            raise UsageError(f"--resize must be >= 1, got {resize}")
        base.resize, base.source = resize, "options"
    if crop is not None:
        if crop < 1:
            raise UsageError(f"--crop must be >= 1, got {crop}")
        base.crop, base.source = crop, "options"
    if mean is not None:
        base.mean, base.source = tuple(mean), "options"
        base.given += ("--mean",)
    if std is not None:
        if any(s == 0 for s in std):
            raise UsageError("--std values must not be 0")
        base.std, base.source = tuple(std), "options"
        base.given += ("--std",)
    return base
