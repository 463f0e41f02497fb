"""Inputs: image paths from files, directories, globs or stdin; decoded, converted, preprocessed.

``collect_paths`` expands what the user typed into a sorted list of files.
``load_image`` decodes one file with Pillow (EXIF orientation applied, any mode converted
to RGB or L). ``Preprocess`` turns PIL images into a normalised tensor and remembers the
geometry (resize then centre crop) so that a map computed on the crop can be drawn back on
the original image (:meth:`Preprocess.uncrop_box`). ``iter_batches`` groups images.
"""

from __future__ import annotations

import glob
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch
    from PIL import Image

IMAGE_EXTENSIONS = {
    ".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm",
    ".pbm", ".pnm", ".ico", ".tga", ".jp2", ".jfif", ".dib", ".pcx", ".sgi", ".im",
}

# Pillow's decompression-bomb guard, kept (and made an error, not a warning): 20000x20000
# would take 1.2 GB as RGB before resizing.
MAX_PIXELS = 89_478_485
# Smaller images carry no structure to inspect; upsampling 1x1 to 224x224 is a mistake.
MIN_SIDE = 8

PRESETS: dict[str, dict[str, Any]] = {
    "imagenet": {"resize": 256, "crop": 224, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)},
    "inception": {"resize": 342, "crop": 299, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)},
    "clip": {"resize": 224, "crop": 224, "mean": (0.4815, 0.4578, 0.4082), "std": (0.2686, 0.2613, 0.2758)},
    "unit": {"resize": None, "crop": None, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)},
}


def collect_paths(items: Sequence[str], *, stdin: Any = None) -> list[Path]:
    """Expand files, directories (recursively, sorted), globs and ``-`` (paths on stdin, one
    per line or NUL-separated as ``find -print0`` writes them). Hidden files and folders
    inside a directory are left out (macOS ``._name.jpg`` files are not images); a file
    named twice is kept once, where it first appears."""
    out: list[Path] = []
    for item in items:
        if item == "-":
            stream = stdin if stdin is not None else sys.stdin
            data = stream.read() if stream is not None else ""
            if isinstance(data, bytes):
                data = data.decode("utf-8", errors="surrogateescape")
            parts = data.split("\0") if "\0" in data else data.splitlines()
            lines = [ln.strip() for ln in parts if ln.strip()]
            if not lines:
                raise InputError("'-' was given but stdin holds no image paths (one per line)")
            out.extend(collect_paths(lines))
            continue
        p = Path(item)
        if p.is_dir():
            found = _walk_images(p)
            if not found:
                raise InputError(
                    f"directory '{item}' holds no images ({', '.join(sorted(IMAGE_EXTENSIONS)[:6])}, ...)"
                )
            out.extend(found)
        elif p.exists():
            out.append(p)
        elif any(c in item for c in "*?["):
            found = sorted(Path(f) for f in glob.glob(item, recursive=True) if os.path.isfile(f))
            if not found:
                raise InputError(f"pattern '{item}' matches no file")
            out.extend(found)
        else:
            raise InputError(f"image '{item}' does not exist")
    seen: set[str] = set()
    unique: list[Path] = []
    for q in out:
        key = os.path.realpath(q)
        if key not in seen:
            seen.add(key)
            unique.append(q)
    return unique


def _walk_images(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):  # symlinked folders are not followed: no loops
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
                found.append(Path(folder) / f)
    return sorted(found)


@dataclass
class LoadedImage:
    path: Path
    image: Image.Image  # RGB or L, EXIF-oriented: what the user sees
    original_mode: str
    warnings: list[str] = field(default_factory=list)


def load_image(path: Path, *, channels: int = 3) -> LoadedImage:
    """Decode ``path`` to an RGB (or L for 1-channel models) image; one-line errors that
    name the file. The size is checked from the header before any pixel is decoded."""
    from PIL import Image, ImageOps

    notes: list[str] = []
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"image '{path}' cannot be read: {exc.strerror or exc}") from exc
    if path.is_dir():
        raise InputError(f"image '{path}' is a directory")
    if size == 0:
        raise InputError(f"image '{path}' is an empty file")
    old_max = Image.MAX_IMAGE_PIXELS
    try:
        # Pillow's own guard only warns below 2x its limit; ours is an error with the size.
        Image.MAX_IMAGE_PIXELS = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as src:  # reads the header only
                w, h = src.size
                if w * h > MAX_PIXELS:
                    raise InputError(
                        f"image '{path}' is {w}x{h} pixels, over the {MAX_PIXELS:,}-pixel safety "
                        "limit (decompression-bomb guard); resize it first"
                    )
                if min(w, h) < MIN_SIDE:
                    raise InputError(
                        f"image '{path}' is {w}x{h} pixels, smaller than {MIN_SIDE}x{MIN_SIDE}; "
                        "too small to inspect (is it a thumbnail or a tracking pixel?)"
                    )
                frames = getattr(src, "n_frames", 1)
                if frames > 1:
                    notes.append(f"'{path}' has {frames} frames; using the first")
                    src.seek(0)
                mode = src.mode
                src.load()
                img = ImageOps.exif_transpose(src)
                if img is src:
                    img = src.copy()
    except InputError:
        raise
    except Image.UnidentifiedImageError as exc:
        raise InputError(f"'{path}' is not an image Pillow can read") from exc
    except PermissionError as exc:
        raise InputError(f"image '{path}' cannot be read: permission denied") from exc
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise InputError(f"image '{path}' is corrupt or truncated ({reason}); re-save or remove it") from exc
    finally:
        Image.MAX_IMAGE_PIXELS = old_max
    try:
        img = _convert(img, channels)
    except (ValueError, OSError) as exc:
        raise InputError(
            f"image '{path}' has pixel mode {mode}, which cannot be converted to "
            f"{'grayscale' if channels == 1 else 'RGB'}; save it as RGB"
        ) from exc
    return LoadedImage(path=path, image=img, original_mode=mode, warnings=notes)


def _convert(img: Image.Image, channels: int) -> Image.Image:
    """Any Pillow mode (L, LA, P, RGBA, CMYK, I;16, I, F, 1, YCbCr...) to RGB or L."""
    import numpy as np
    from PIL import Image

    mode = img.mode
    if mode.startswith("I;16") or mode in ("I", "F"):
        # 16/32-bit gray: map the file's value range to 8 bits instead of clipping at 255.
        arr = np.asarray(img, dtype=np.float64)
        hi_val = float(arr.max()) if arr.size else 0.0
        lo_val = float(arr.min()) if arr.size else 0.0
        if mode.startswith("I;16") or (mode == "I" and 255 < hi_val <= 65535 and lo_val >= 0):
            lo, hi = 0.0, 65535.0
        elif mode == "F" and 0.0 <= lo_val and hi_val <= 1.0:
            lo, hi = 0.0, 1.0
        elif lo_val >= 0 and hi_val <= 255:
            lo, hi = 0.0, 255.0
        else:
            lo, hi = lo_val, hi_val
        arr = np.clip((arr - lo) / max(hi - lo, 1e-12) * 255.0, 0, 255).round().astype(np.uint8)
        img = Image.fromarray(arr, mode="L")
    elif mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in img.info):
        # Composite on white: transparent pixels are usually background.
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(bg, rgba).convert("RGB")
    if channels == 1:
        return img.convert("L")
    return img.convert("RGB")


@dataclass
class Preprocess:
    """Resize (shorter side), centre crop, to tensor, normalise; all recorded for reports."""

    resize: int | None = 256
    crop: int | None = 224
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    interpolation: str = "bilinear"
    source: str = "imagenet preset"

    def describe(self) -> dict[str, Any]:
        return {
            "resize": self.resize, "crop": self.crop, "mean": list(self.mean), "std": list(self.std),
            "interpolation": self.interpolation, "source": self.source,
        }

    def geometry(self, width: int, height: int) -> tuple[float, float, float, float, float]:
        """(scale, left, top, crop_w, crop_h) in resized pixels: where the crop came from."""
        scale = 1.0
        if self.resize:
            scale = self.resize / min(width, height)
        rw, rh = width * scale, height * scale
        cw = ch = float(self.crop) if self.crop else 0.0
        if not self.crop:
            cw, ch = rw, rh
        left = (rw - cw) / 2.0
        top = (rh - ch) / 2.0
        return scale, left, top, cw, ch

    def uncrop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The crop's box (left, top, right, bottom) in original-image pixels. A map over the
        model input covers exactly this box of the original (it may reach outside it)."""
        scale, left, top, cw, ch = self.geometry(width, height)
        return (left / scale, top / scale, (left + cw) / scale, (top + ch) / scale)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        interp = getattr(InterpolationMode, self.interpolation.upper(), InterpolationMode.BILINEAR)
        if self.resize:
            img = F.resize(img, self.resize, interpolation=interp)
        if self.crop:
            img = F.center_crop(img, [self.crop, self.crop])
        t = F.pil_to_tensor(img).to(torch.float32).div_(255.0)  # (C, H, W)
        c = t.shape[0]
        mean = list(self.mean) if len(self.mean) == c else [sum(self.mean) / len(self.mean)] * c
        std = list(self.std) if len(self.std) == c else [sum(self.std) / len(self.std)] * c
        return F.normalize(t, mean, std)


def preprocess_from_weights(transforms: Any) -> Preprocess | None:
    """The :class:`Preprocess` equal to a torchvision weights' ImageClassification transform."""
    if transforms is None:
        return None
    crop = getattr(transforms, "crop_size", None)
    resize = getattr(transforms, "resize_size", None)
    mean = getattr(transforms, "mean", None)
    std = getattr(transforms, "std", None)
    if not crop or mean is None or std is None:
        return None
    interp = getattr(transforms, "interpolation", None)
    return Preprocess(
        resize=int(resize[0]) if resize else None,
        crop=int(crop[0]),
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
) -> Preprocess:
    """Explicit options win over a preset, which wins over the weights' own transforms,
    which win over an ImageNet-style default sized for the model (``input_hw``)."""
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"--preset '{preset}' is not one of {', '.join(PRESETS)}")
    base = preprocess_from_weights(transforms) if preset is None else None
    if base is None:
        p = dict(PRESETS[preset or "imagenet"])
        if preset is None and input_hw and input_hw != 224:
            p["crop"] = input_hw
            p["resize"] = int(round(input_hw * 256 / 224))
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
    if std is not None:
        if any(s == 0 for s in std):
            raise UsageError("--std values must not be 0")
        base.std, base.source = tuple(std), "options"
    return base


@dataclass
class ImageBatch:
    """A batch of preprocessed images and where they came from."""

    tensor: torch.Tensor  # (N, C, H, W)
    images: list[LoadedImage]

    @property
    def names(self) -> list[str]:
        return [str(i.path) for i in self.images]


def iter_batches(
    paths: Sequence[Path],
    preprocess: Preprocess,
    *,
    batch_size: int = 8,
    channels: int = 3,
    skip_bad: bool = False,
    skipped: list[tuple[str, str]] | None = None,
    notes: list[str] | None = None,
) -> Iterator[ImageBatch]:
    """Decode and preprocess ``paths`` in groups of ``batch_size`` (streamed, not all at once).
    With ``skip_bad`` a bad file is recorded in ``skipped`` instead of raising; per-image
    warnings (first frame of an animation) go to ``notes``. Without a crop, images of
    different sizes cannot share a batch: a batch then ends early where the size changes."""
    import torch

    if batch_size < 1:
        raise InputError(f"--batch-size must be 1 or more, got {batch_size}")
    pending: list[LoadedImage] = []
    tensors: list[torch.Tensor] = []
    for p in paths:
        try:
            li = load_image(p, channels=channels)
            t = preprocess(li.image)
        except InputError as exc:
            if not skip_bad:
                raise
            if skipped is not None:
                skipped.append((str(p), str(exc)))
            continue
        if notes is not None:
            notes.extend(li.warnings)
        if tensors and t.shape != tensors[0].shape:
            yield ImageBatch(torch.stack(tensors), pending)
            pending, tensors = [], []
        pending.append(li)
        tensors.append(t)
        if len(pending) == batch_size:
            yield ImageBatch(torch.stack(tensors), pending)
            pending, tensors = [], []
    if pending:
        yield ImageBatch(torch.stack(tensors), pending)


@dataclass
class InputBatch:
    """What a subcommand feeds the model: images, or a seeded random/zero tensor."""

    tensor: torch.Tensor  # (N, C, H, W) on the run's device and dtype
    names: list[str]  # image paths, or "random-0", ...
    images: list[LoadedImage] | None  # None for synthetic input


@dataclass
class InputPlan:
    """The resolved input options of one run; ``batches()`` streams :class:`InputBatch`.

    While streaming, ``skipped`` collects ``(path, reason)`` for each bad file passed over
    with ``--skip-bad-inputs`` and ``warnings`` the per-image notes; commands print them with
    :meth:`drain_warnings` as they go and put :meth:`input_report` in their report.
    """

    paths: list[Path]
    preprocess: Preprocess | None
    input_size: tuple[int, ...] | None
    batch_size: int
    channels: int
    seed: int
    fill: str
    skip_bad: bool
    device: Any = "cpu"
    dtype: Any = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processed: int = 0  # images fed to the model so far
    _drained: int = 0
    _skips_drained: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "images": [str(p) for p in self.paths],
            "preprocessing": self.preprocess.describe() if self.preprocess else None,
            "input_size": list(self.input_size) if self.input_size else None,
            "batch_size": self.batch_size,
            "channels": self.channels,
            "seed": self.seed,
            "fill": None if self.paths else self.fill,
            "skip_bad_inputs": self.skip_bad,
        }

    def input_report(self) -> dict[str, Any]:
        """How the inputs went: counts, skipped files with reasons, warnings."""
        return {
            "images_total": len(self.paths),
            "images_used": self.processed,
            "skipped_count": len(self.skipped),
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "warnings": list(self.warnings),
        }

    def drain_warnings(self) -> list[str]:
        """Warnings (including skipped files) not returned by an earlier call."""
        new = list(self.warnings[self._drained:])
        new += [f"skipped {r}" for _, r in self.skipped[self._skips_drained:]]
        self._drained = len(self.warnings)
        self._skips_drained = len(self.skipped)
        return new

    def batches(self) -> Iterator[InputBatch]:
        import torch

        dtype = self.dtype or torch.float32
        if not self.paths:
            from inspect_model.loading.shapes import make_example_inputs

            assert self.input_size is not None
            (x,) = make_example_inputs([self.input_size], batch_size=self.batch_size, dtype=dtype,
                                       device=self.device, seed=self.seed, fill=self.fill)
            self.processed = self.batch_size
            yield InputBatch(x, [f"{self.fill}-{i}" for i in range(self.batch_size)], None)
            return
        assert self.preprocess is not None
        self.processed = 0
        for b in iter_batches(self.paths, self.preprocess, batch_size=self.batch_size,
                              channels=self.channels, skip_bad=self.skip_bad, skipped=self.skipped,
                              notes=self.warnings):
            self.processed += len(b.images)
            yield InputBatch(b.tensor.to(device=self.device, dtype=dtype), b.names, b.images)
        if self.processed == 0 and self.skipped:
            first_reason = self.skipped[0][1]
            raise InputError(
                f"none of the {len(self.paths)} images could be read (--skip-bad-inputs skipped them "
                f"all); first: {first_reason}"
            )


def model_channels(model: Any, default: int = 3) -> int:
    """Input channels the first conv layer expects (1 for a grayscale model), else ``default``.
    TorchScript and exported modules are read from their first weight's shape."""
    import torch
    from torch import nn

    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return int(m.in_channels)
        if isinstance(m, nn.Linear):
            return default
        kind = getattr(m, "original_name", None) or type(m).__name__
        weight = getattr(m, "weight", None)
        if kind in ("Conv1d", "Conv2d", "Conv3d") and isinstance(weight, torch.Tensor) and weight.dim() >= 3:
            return int(weight.shape[1])
        if kind == "Linear":
            return default
    return default


def plan_inputs(
    loaded: Any,
    images: Sequence[str] | None,
    *,
    input_size: str | None = None,
    batch_size: int = 8,
    seed: int = 0,
    fill: str = "random",
    preset: str | None = None,
    resize: int | None = None,
    crop: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    skip_bad: bool = False,
    device: Any = "cpu",
    dtype: Any = None,
    stdin: Any = None,
) -> InputPlan:
    """Resolve the input options against a loaded model (see :class:`InputPlan`)."""
    from inspect_model.loading.shapes import parse_size

    if batch_size < 1:
        raise InputError(f"--batch-size must be 1 or more, got {batch_size}")
    paths = collect_paths(list(images), stdin=stdin) if images else []
    channels = model_channels(loaded.model)
    size: tuple[int, ...] | None = None
    if input_size:
        size = parse_size(input_size)
    elif loaded.input_sizes:
        size = tuple(loaded.input_sizes[0])
    pre = None
    if paths:
        hw = size[-1] if size and len(size) == 3 else None
        pre = build_preprocess(transforms=loaded.transforms, preset=preset, resize=resize, crop=crop,
                               mean=mean, std=std, input_hw=hw)
        if input_size and size and len(size) == 3:
            # An explicit --input-size with images: crop to it.
            pre.crop = size[-1]
    elif size is None:
        raise InputError(
            f"no images given and the input size of {loaded.name} is unknown; "
            "pass images or --input-size, e.g. --input-size 3x224x224"
        )
    static = getattr(loaded, "static_batch", None)
    if static is not None:
        # torch.export fixed the batch dimension: every batch must have exactly that size.
        if batch_size != static:
            raise InputError(
                f"{loaded.name} was exported with a static batch size of {static}; pass "
                f"--batch-size {static}, or export it again with a dynamic batch dimension "
                "(dynamic_shapes={'x': {0: torch.export.Dim('batch')}})"
            )
        if paths and len(paths) % static:
            raise InputError(
                f"{loaded.name} was exported with a static batch size of {static}, and "
                f"{len(paths)} images do not fill whole batches; give a multiple of {static} images "
                "or export it with a dynamic batch dimension"
            )
    return InputPlan(paths=paths, preprocess=pre, input_size=size, batch_size=batch_size,
                     channels=channels, seed=seed, fill=fill, skip_bad=skip_bad, device=device, dtype=dtype)
