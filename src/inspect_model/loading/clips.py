"""Clips as model inputs: the weights' video preprocessing and a plan that streams clip batches.

:class:`VideoPreprocess` is torchvision's ``VideoClassification`` transform (resize with
``antialias=False``, centre crop, scale to [0, 1], normalise, (T, C, H, W) -> (C, T, H, W)),
its sizes and statistics read from the weights (or, for a torchvision video model built with
``--weights none``, from its default weights, which are never downloaded for this), and
``--resize``/``--crop``/``--mean``/``--std`` override them. :class:`ClipPlan` has the
interface of :class:`~inspect_model.loading.inputs.InputPlan`: ``batches()`` yields batches
of (N, C, T, H, W) clips whose ``images`` are :class:`~.video.LoadedClip` records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.loading.plans import Plan
from inspect_model.errors import InputError
from inspect_model.loading.samples import Sample, Samples, probed
from inspect_model.loading.video import ClipOptions, LoadedClip, clip_indices, display_copy, read_frames

if TYPE_CHECKING:
    import torch

# r3d_18's Kinetics-400 preprocessing: the default for a video model that names none.
KINETICS = {"resize": (128, 171), "crop": (112, 112), "mean": (0.43216, 0.394666, 0.37645),
            "std": (0.22803, 0.22145, 0.216989)}


@dataclass
class VideoPreprocess:
    """torchvision's VideoClassification, with its numbers recorded for the report."""

    resize: tuple[int, ...] | None = (128, 171)  # (h, w) exactly, or (side,) for the shorter side
    crop: tuple[int, int] | None = (112, 112)
    mean: tuple[float, ...] = KINETICS["mean"]
    std: tuple[float, ...] = KINETICS["std"]
    interpolation: str = "bilinear"
    source: str = "kinetics preset"

    def describe(self) -> dict[str, Any]:
        return {"resize": list(self.resize) if self.resize else None, "crop": list(self.crop) if self.crop else None,
                "mean": list(self.mean), "std": list(self.std), "interpolation": self.interpolation,
                "source": self.source, "antialias": False}

    def resized(self, width: int, height: int) -> tuple[float, float]:
        if not self.resize:
            return float(width), float(height)
        if len(self.resize) == 2:
            return float(self.resize[1]), float(self.resize[0])
        s = self.resize[0] / min(width, height)
        return width * s, height * s

    def uncrop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The crop's box in pixels of a frame of ``width`` x ``height`` (any scale of the video)."""
        rw, rh = self.resized(width, height)
        ch, cw = (float(self.crop[0]), float(self.crop[1])) if self.crop else (rh, rw)
        left, top = (rw - cw) / 2.0, (rh - ch) / 2.0
        sx, sy = rw / width, rh / height
        return (left / sx, top / sy, (left + cw) / sx, (top + ch) / sy)

    def __call__(self, frames: Sequence[Any]) -> torch.Tensor:
        """PIL frames -> (C, T, H, W) float32, as VideoClassification computes it."""
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        vid = torch.stack([F.pil_to_tensor(f) for f in frames])  # (T, C, H, W) uint8
        interp = getattr(InterpolationMode, self.interpolation.upper(), InterpolationMode.BILINEAR)
        if self.resize:
            vid = F.resize(vid, list(self.resize), interpolation=interp, antialias=False)
        if self.crop:
            vid = F.center_crop(vid, list(self.crop))
        vid = F.convert_image_dtype(vid, torch.float)
        c = vid.shape[1]
        mean = list(self.mean) if len(self.mean) == c else [sum(self.mean) / len(self.mean)] * c
        std = list(self.std) if len(self.std) == c else [sum(self.std) / len(self.std)] * c
        vid = F.normalize(vid, mean=mean, std=std)
        return vid.permute(1, 0, 2, 3).contiguous()  # (C, T, H, W)


def video_preprocess(loaded: Any, *, resize: int | None = None, crop: int | None = None,
                     mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> VideoPreprocess:
    """The weights' video transform (see the module docstring), options winning."""
    t = loaded.transforms
    source = "weights transforms"
    if t is None and getattr(loaded, "source", None) == "torchvision":
        try:
            from torchvision import models

            w = models.get_model_weights(loaded.name).DEFAULT
            t, source = w.transforms(), f"transforms of {w} (the model was built without weights)"
        except Exception:
            t = None
    if t is not None and getattr(t, "crop_size", None) and getattr(t, "mean", None) is not None:
        pre = VideoPreprocess(tuple(int(v) for v in t.resize_size), tuple(int(v) for v in t.crop_size),
                              tuple(float(v) for v in t.mean), tuple(float(v) for v in t.std),
                              getattr(t.interpolation, "value", "bilinear"), source)
    else:
        pre = VideoPreprocess()
    if resize is not None:
        pre.resize, pre.source = (resize,), "options"
    if crop is not None:
        pre.crop, pre.source = (crop, crop), "options"
    if mean is not None:
        pre.mean, pre.source = tuple(mean), "options"
    if std is not None:
        pre.std, pre.source = tuple(std), "options"
    return pre


@dataclass
class ClipPlan(Plan):
    unit = "clip"
    """Clips of the given videos (or folders of frames), streamed in batches (see the module
    docstring); the same fields as ``InputPlan`` that the pipeline reads."""

    paths: list[Path]
    preprocess: VideoPreprocess
    options: ClipOptions
    frames: int
    batch_size: int
    seed: int = 0
    skip_bad: bool = False
    device: Any = "cpu"
    dtype: Any = None
    channels: int = 3
    input_size: tuple[int, ...] | None = None
    fill: str = "random"
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processed: int = 0
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # the current batch's clip records

    def describe(self) -> dict[str, Any]:
        return {"images": [str(p) for p in self.paths], "preprocessing": self.preprocess.describe(),
                "input_size": None, "batch_size": self.batch_size, "channels": self.channels,
                "seed": self.seed, "fill": None, "skip_bad_inputs": self.skip_bad,
                "clips": {"frames": self.frames, "stride": self.options.stride, "clips": self.options.clips,
                          "decoder": "PyAV"}}

    def extra_record(self, name: str) -> dict[str, Any]:
        """The clip a report entry named ``name`` came from (``clip`` key), or {}."""
        rec = self.records.get(name)
        return {"clip": rec} if rec is not None else {}

    def __post_init__(self) -> None:
        self.samples = Samples(self._samples)

    def units(self) -> list[str]:
        """The clips, by name: what shards and checkpoints count (loading/samples.py)."""
        return self.samples.units()

    def select(self, names: list[str] | None) -> None:
        self.samples.select(names)

    def _samples(self) -> list[Sample]:
        out = []
        for path in self.paths:
            info, error = probed(path, self.skip_bad)
            if info is not None:
                try:
                    plans = clip_indices(info.frames, self.frames, self.options.stride, self.options.clips,
                                         name=f"video '{path}'")
                except InputError as exc:
                    if not self.skip_bad:
                        raise
                    info, error = None, str(exc)
            if info is None:
                out.append(Sample(str(path), path, error=error))
                continue
            out += [Sample(str(path) if len(plans) == 1 else f"{path}#clip{k}", path, k, tuple(idx), info=info)
                    for k, idx in enumerate(plans)]
        return out

    def clips(self) -> Iterator[tuple[str, torch.Tensor, LoadedClip]]:
        for s in self.samples.chosen():
            if s.info is None:
                self.skipped.append((str(s.path), str(s.error)))
                continue
            try:
                info = s.info
                decoded = read_frames(info, s.indices)
            except InputError as exc:
                if not self.skip_bad:
                    raise
                self.skipped.append((s.name, str(exc)))
                continue
            pics = [f.image for f in decoded]
            clip = LoadedClip(s.path, s.clip, [f.index for f in decoded], [f.time for f in decoded],
                              [display_copy(p) for p in pics], (info.width, info.height), info.frames, info.fps)
            yield s.name, self.preprocess(pics), clip

    def batches(self) -> Iterator[Any]:
        import torch

        from inspect_model.loading.batch import InputBatch

        dtype = self.dtype or torch.float32
        self.processed = 0
        names: list[str] = []
        xs: list[torch.Tensor] = []
        clips: list[LoadedClip] = []

        def flush() -> InputBatch:
            self.records = {n: c.describe() for n, c in zip(names, clips)}
            self.processed += len(names)
            return InputBatch(torch.stack(xs).to(device=self.device, dtype=dtype), list(names), list(clips))

        for name, x, clip in self.clips():
            if xs and x.shape != xs[0].shape:
                yield flush()
                names, xs, clips = [], [], []
            names.append(name)
            xs.append(x)
            clips.append(clip)
            if len(names) == self.batch_size:
                yield flush()
                names, xs, clips = [], [], []
        if names:
            yield flush()
        everything = self.samples.only is None  # a shard or a resumed rest may hold only skipped clips
        if self.processed == 0 and (everything or all(s.info is None for s in self.samples.all or [])):
            first = self.skipped[0][1] if self.skipped else "no clip"
            raise InputError(f"none of the {len(self.paths)} videos could be read; first: {first}")


def default_frames(loaded: Any, input_size: tuple[int, ...] | None) -> int:
    """Frames per clip: a 4-D --input-size's T, else the model's default input (16 for
    torchvision's video models), at least the weights' minimum temporal size."""
    if input_size and len(input_size) == 4:
        return int(input_size[1])
    sizes = getattr(loaded, "input_sizes", None)
    if sizes and len(sizes[0]) == 4:
        return int(sizes[0][1])
    return 16
