"""Inputs: image paths preprocessed into model inputs, or synthetic inputs, in batches.

Finding and decoding image files (``collect_paths``, ``load_image``, ``LoadedImage``) lives
in :mod:`inspect_model.loading.images`, and turning an image into a normalised tensor
(``Preprocess``, ``build_preprocess``, ``PRESETS``) in :mod:`inspect_model.loading.preprocess`;
both are re-exported here. ``iter_batches`` groups images; ``plan_inputs`` resolves a run's
input options into an :class:`InputPlan` that streams :class:`InputBatch`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.loading.plans import Plan
from inspect_model.errors import InputError
from inspect_model.loading.batch import InputBatch
from inspect_model.loading.images import LoadedImage, collect_paths, load_image
from inspect_model.loading.preprocess import (
    PRESETS,
    Preprocess,
    build_preprocess,
    preprocess_from_weights,
)

if TYPE_CHECKING:
    import torch

# The image helpers (loading/images.py) and the preprocessing (loading/preprocess.py) are
# re-exported, so that imports from this module keep working.
__all__ = [
    "PRESETS", "ImageBatch", "InputBatch", "InputPlan", "LoadedImage", "Preprocess", "TensorPlan",
    "build_preprocess", "collect_paths", "iter_batches", "load_image", "model_channels", "plan_inputs",
    "preprocess_from_weights",
]


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
    workers: int = 0,
) -> Iterator[ImageBatch]:
    """Decode and preprocess ``paths`` in groups of ``batch_size`` (streamed, not all at once).
    With ``skip_bad`` a bad file is recorded in ``skipped`` instead of raising; per-image
    warnings (first frame of an animation) go to ``notes``. Without a crop, images of
    different sizes cannot share a batch: a batch then ends early where the size changes.
    With ``workers`` > 0, decoding and preprocessing run in that many DataLoader worker
    processes (in order); the batches are the same."""
    import torch

    if batch_size < 1:
        raise InputError(f"--batch-size must be 1 or more, got {batch_size}")
    pending: list[LoadedImage] = []
    tensors: list[torch.Tensor] = []
    for p, decoded in _decoded(paths, preprocess, channels, batch_size, workers):
        if isinstance(decoded, InputError):
            if not skip_bad:
                raise decoded
            if skipped is not None:
                skipped.append((str(p), str(decoded)))
            continue
        li, t = decoded
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


def _decode_one(p: Path, preprocess: Preprocess, channels: int) -> tuple[LoadedImage, torch.Tensor] | InputError:
    try:
        li = load_image(p, channels=channels, resize=preprocess.resize)  # size guard after the resize
        return li, preprocess(li.image)
    except InputError as exc:
        return exc  # returned, not raised: a worker's error reaches the main process as a value


class _DecodeSet:
    """A map-style dataset over image paths for torch's DataLoader: decode and preprocess."""

    def __init__(self, paths: Sequence[Path], preprocess: Preprocess, channels: int) -> None:
        self.paths, self.preprocess, self.channels = list(paths), preprocess, channels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Path, Any]:
        p = self.paths[i]
        return p, _decode_one(p, self.preprocess, self.channels)


def _as_list(items: list[Any]) -> list[Any]:
    return items  # collate: keep (path, decoded) pairs as they are


def _decoded(paths: Sequence[Path], preprocess: Preprocess, channels: int, batch_size: int,
             workers: int) -> Iterator[tuple[Path, Any]]:
    """(path, (image, tensor) or InputError) for each path, in order."""
    if workers <= 0:
        for p in paths:
            yield p, _decode_one(p, preprocess, channels)
        return
    from torch.utils.data import DataLoader

    loader = DataLoader(_DecodeSet(paths, preprocess, channels), batch_size=batch_size, shuffle=False,
                        num_workers=workers, collate_fn=_as_list, prefetch_factor=2)
    for chunk in loader:
        yield from chunk


@dataclass
class InputPlan(Plan):
    """The resolved input options of one run; ``batches()`` streams :class:`InputBatch`.

    While streaming, ``skipped`` collects ``(path, reason)`` for each bad file passed over
    with ``--skip-bad-inputs`` and ``warnings`` the per-image notes; the pipeline puts both
    in the report (``api.pipeline.input_outcome``).
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
    spec: Any = None  # loading.shapes.InputSpec of --input-size (its dtype and value range)
    workers: int = 0  # DataLoader worker processes for decoding (0: in this process)
    vocab: int | None = None  # text models: synthetic inputs are token ids below this


    def use_workers(self, workers: int) -> None:
        self.workers = workers
    def describe(self) -> dict[str, Any]:
        return {
            "images": [str(p) for p in self.paths],
            "preprocessing": self.preprocess.describe(self.channels) if self.preprocess else None,
            # None where images keep their own sizes (no crop: detectors, segmenters, --preset unit)
            "input_size": list(self.input_size) if self.input_size and not self._own_sizes() else None,
            "batch_size": self.batch_size,
            "channels": self.channels,
            "seed": self.seed,
            "fill": None if self.paths else self.fill,
            "skip_bad_inputs": self.skip_bad,
        }

    def _own_sizes(self) -> bool:
        return bool(self.paths) and self.preprocess is not None and not self.preprocess.crop

    def batches(self) -> Iterator[InputBatch]:
        import torch

        dtype = self.dtype or torch.float32
        if not self.paths:
            from inspect_model.loading.shapes import make_example_inputs

            assert self.input_size is not None
            if self.spec is not None and self.spec.is_integer:  # token ids: integers in their range
                from inspect_model.loading.shapes import make_input

                x = make_input(self.spec, self.batch_size, device=self.device, seed=self.seed)
            else:
                (x,) = make_example_inputs([self.input_size], batch_size=self.batch_size, dtype=dtype,
                                           device=self.device, seed=self.seed, fill=self.fill,
                                           vocab=self.vocab)
            self.processed = self.batch_size
            yield InputBatch(x, [f"{self.fill}-{i}" for i in range(self.batch_size)], None)
            return
        assert self.preprocess is not None
        self.processed = 0
        for b in iter_batches(self.paths, self.preprocess, batch_size=self.batch_size,
                              channels=self.channels, skip_bad=self.skip_bad, skipped=self.skipped,
                              notes=self.warnings, workers=self.workers):
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
    clip: bool = False,
    clip_options: Any = None,
    exclude: Any = None,
    notes: Any = None,
) -> Any:
    """Resolve the input options against a loaded model (see :class:`InputPlan`); a video
    or optical-flow model gets a clip or pair plan (:mod:`inspect_model.loading.media`).
    ``exclude``: the run's output directory, left out of folders and globs (a note to
    ``notes(text)`` says how many files that drops)."""
    from inspect_model.loading.media import clip_folders
    from inspect_model.loading.shapes import parse_size

    if batch_size < 1:
        raise InputError(f"--batch-size must be 1 or more, got {batch_size}")
    missing: list[tuple[str, str]] = []  # with --skip-bad-inputs: missing paths, skipped like bad files
    folders = clip_folders(images, clip)  # --clip: a folder of frames is one video
    items = [i for i in images or [] if Path(i) not in folders]
    excluded: list[Path] = []
    paths = collect_paths(items, stdin=stdin, missing=missing if skip_bad else None, exclude=exclude,
                          excluded=excluded) if items else []
    if excluded and notes is not None:
        notes(f"left out {len(excluded)} file(s) under the output directory '{exclude}' (earlier results, "
              "not inputs); name a file on its own to inspect it")
    if skip_bad and images and not paths and missing:
        raise InputError(f"none of the {len(missing)} image paths exists (first: '{missing[0][0]}')")
    media = _media_plan(loaded, paths + folders, input_size, clip_options, batch_size=batch_size, seed=seed,
                        skip_bad=skip_bad, device=device, dtype=dtype, resize=resize, crop=crop, mean=mean, std=std)
    if media is not None:
        return media
    channels = model_channels(loaded.model)
    size: tuple[int, ...] | None = None
    spec = None
    if input_size:
        size = parse_size(input_size)
        if ":" in input_size or "=" in input_size:
            from inspect_model.loading.shapes import parse_input_spec

            spec = parse_input_spec(input_size)
    elif loaded.input_sizes:
        size = tuple(loaded.input_sizes[0])
    pre = None
    if paths:
        hw = size[-1] if size and len(size) == 3 else None
        from inspect_model.loading.loaded import infer_task

        # infer_task: torchvision's detector and segmenter classes (by name or built in code)
        pre = build_preprocess(transforms=loaded.transforms, preset=preset, resize=resize, crop=crop,
                               mean=mean, std=std, input_hw=hw, task=infer_task(loaded.model))
        if input_size and size and len(size) == 3:
            # An explicit --input-size with images: crop to it.
            pre.crop = size[-1]
    elif size is None:
        raise InputError(
            f"no images given and the input size of {loaded.name} is unknown; "
            "pass images or --input-size, e.g. --input-size 3x224x224"
        )
    from inspect_model.loading.saved_models import check_static_batch

    check_static_batch(loaded, batch_size, len(paths) if paths else None)
    return InputPlan(paths=paths, preprocess=pre, input_size=size, batch_size=batch_size,
                     channels=channels, seed=seed, fill=fill, skip_bad=skip_bad, device=device, dtype=dtype,
                     spec=spec, skipped=missing, vocab=getattr(loaded, "token_vocab", None))


def _media_plan(loaded: Any, paths: list[Path], input_size: str | None, clip_options: Any, **kw: Any) -> Any:
    from inspect_model.loading.media import plan_media
    from inspect_model.loading.shapes import parse_size
    from inspect_model.loading.video import ClipOptions

    size = parse_size(input_size) if input_size else None
    return plan_media(loaded, paths, options=clip_options or ClipOptions(), input_size=size, **kw)


@dataclass
class TensorPlan(Plan):
    """Inputs given as a tensor (N, C, H, W) by the Python API, streamed in batches."""

    tensor: torch.Tensor
    names: list[str] | None = None
    batch_size: int = 8
    seed: int = 0
    paths: list[Path] = field(default_factory=list)
    preprocess: Preprocess | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = int(self.tensor.shape[0])
        if self.names is None:
            self.names = [f"input-{i}" for i in range(n)]
        if len(self.names) != n:
            raise InputError(f"{len(self.names)} names for {n} inputs")
        if self.batch_size < 1:
            raise InputError(f"batch_size must be 1 or more, got {self.batch_size}")

    def describe(self) -> dict[str, Any]:
        return {"images": [], "preprocessing": None, "input_size": list(self.tensor.shape[1:]),
                "batch_size": self.batch_size, "channels": int(self.tensor.shape[1]) if self.tensor.dim() > 1 else 1,
                "seed": self.seed, "fill": "tensor", "skip_bad_inputs": False}

    def batches(self) -> Iterator[InputBatch]:
        assert self.names is not None
        x = self.tensor.detach()
        for start in range(0, int(x.shape[0]), self.batch_size):
            yield InputBatch(x[start:start + self.batch_size], self.names[start:start + self.batch_size], None)
