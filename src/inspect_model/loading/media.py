"""Which plan a run's inputs take: clips for a video model, pairs for a flow model.

:func:`media_task` tells a video model (``LoadedModel.task``/``family`` "video", or a first
convolution that is 3-D) and a pair model (optical flow) from an image model;
:func:`plan_media` returns a :class:`~.clips.ClipPlan` or :class:`~.pairs.PairPlan` for
them, refuses a video given to an image model, and returns None where the image plan applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inspect_model.errors import InputError, UsageError
from inspect_model.loading.video import ClipOptions, is_video


def media_task(loaded: Any) -> str | None:
    """``"video"``, ``"optical_flow"`` or None (an image model)."""
    task = getattr(loaded, "task", None) or getattr(loaded, "family", None)
    if task in ("video", "optical_flow"):
        return task
    from inspect_model.loading.pairs import is_pair_model

    if is_pair_model(loaded):
        return "optical_flow"
    from torch import nn

    for m in loaded.model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            return "video" if isinstance(m, nn.Conv3d) else None
    return None


def clip_folders(items: Sequence[str] | None, clip: bool) -> list[Path]:
    """The folders given with ``--clip``: each one video, not a folder of images."""
    folders = [Path(i) for i in items or [] if clip and Path(i).is_dir()]
    if clip and not folders:
        raise UsageError("--clip takes a folder of frames as one video; give a folder")
    return folders


def plan_media(loaded: Any, paths: list[Path], *, options: ClipOptions,
               input_size: tuple[int, ...] | None, batch_size: int, seed: int, skip_bad: bool, device: Any,
               dtype: Any, resize: int | None, crop: int | None, mean: Any, std: Any) -> Any:
    """The plan of a video or pair model's inputs (``paths``: files and ``--clip`` folders),
    or None for an image model's images."""
    task = media_task(loaded)
    folders = [p for p in paths if p.is_dir()]
    if task is None:
        videos = [p for p in paths if is_video(p) and p.suffix.lower() != ".gif"] + folders
        if videos:
            raise InputError(f"'{videos[0]}' is a video but {loaded.name} is an image model: give frames as images")
        if options != ClipOptions():
            raise UsageError("--frames, --stride and --clips apply to video and optical-flow models")
        return None
    if task == "optical_flow":
        from inspect_model.loading.pairs import FlowPreprocess, PairBinding, PairPlan, pair_images

        pair_images(paths)  # an odd count fails now, before anything runs

        pre = FlowPreprocess(resize=resize, crop=crop)
        if mean is not None or std is not None:
            pre.mean, pre.std, pre.source = tuple(mean or pre.mean), tuple(std or pre.std), "options"
        size = input_size or (tuple(loaded.input_sizes[0]) if loaded.input_sizes else None)
        if not paths and size is None:
            raise InputError(f"no images given and the input size of {loaded.name} is unknown; pass pairs of "
                             "images or --input-size 3xHxW")
        return PairPlan(paths, pre, PairBinding(), batch_size, options, seed=seed, skip_bad=skip_bad,
                        device=device, dtype=dtype, input_size=size)
    if not paths:
        return None  # a random clip of --input-size: the image plan makes it
    from inspect_model.loading.clips import ClipPlan, default_frames, video_preprocess

    images = [p for p in paths if not is_video(p) and p not in folders]
    if images:
        raise InputError(f"'{images[0]}' is an image but {loaded.name} is a video model: give a video file, "
                         "or a folder of frames with --clip")
    pre = video_preprocess(loaded, resize=resize, crop=crop, mean=mean, std=std)
    frames = options.frames or default_frames(loaded, input_size)
    return ClipPlan(paths, pre, options, frames, batch_size, seed=seed, skip_bad=skip_bad, device=device,
                    dtype=dtype)
