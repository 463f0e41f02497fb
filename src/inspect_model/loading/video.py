"""Video files and folders of frames: probing, clip plans, and decoding only the frames needed.

A video (``.mp4 .avi .mkv .webm .mov .gif``) given to a video model is one or more clips:
``--frames N`` frames ``--stride S`` apart, ``--clips K`` clips spread evenly over the video.
A folder of frames given with ``--clip`` is a video whose frames are its images, in name
order. :func:`clip_indices` plans which frame indices each clip takes; :func:`read_frames`
seeks to the first of them and decodes forward only as far as the last, so memory and time
stay bounded by the clip, never by the video.

Decoder: PyAV (the ``[video]`` extra). PyAV's wheels ship their own FFmpeg libraries, so it
installs and works with pip alone; torchcodec needs a system FFmpeg of a matching major
version, which a plain ``pip install`` does not give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    from PIL import Image

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".gif")
INSTALL_HINT = "pip install 'inspect-model[video]' (PyAV)"
DISPLAY_SIDE = 320  # longest side of the frames kept for strips and animations


def is_video(path: str | Path) -> bool:
    return Path(path).suffix.lower() in VIDEO_SUFFIXES and not Path(path).is_dir()


def require_av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise InputError(f"reading videos needs PyAV: {INSTALL_HINT}") from exc
    return av


@dataclass(frozen=True)
class VideoInfo:
    """What the container says of a video (or a folder of frames) before decoding."""

    path: Path
    frames: int
    fps: float | None  # None for a folder of frames
    width: int
    height: int
    frame_files: tuple[Path, ...] = ()  # a folder of frames: its images, in order

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "frames": self.frames, "fps": self.fps,
                "width": self.width, "height": self.height,
                "kind": "frames folder" if self.frame_files else "video"}


@dataclass(frozen=True)
class ClipOptions:
    """``--frames``, ``--stride``, ``--clips``; ``frames`` None: the model's default."""

    frames: int | None = None
    stride: int = 1
    clips: int = 1

    def __post_init__(self) -> None:
        from inspect_model.loading.limits import check_option

        for opt, v in (("--frames", self.frames), ("--stride", self.stride), ("--clips", self.clips)):
            if v is not None and v < 1:
                raise UsageError(f"{opt} must be 1 or more, got {v}")
            check_option(opt, v)


def clip_indices(total: int, frames: int, stride: int, clips: int, *, name: str = "video") -> list[list[int]]:
    """Frame indices of each clip: ``frames`` frames ``stride`` apart; ``clips`` clips with
    their starts spread evenly from the first frame to the last possible start."""
    span = (frames - 1) * stride + 1
    if total < span:
        need = f"{frames} frames" + (f" at --stride {stride} span {span}" if stride > 1 else "")
        raise InputError(f"{name} has {total} frame(s); {need}: give a longer video, or fewer --frames"
                         + (" or a smaller --stride" if stride > 1 else ""))
    last = total - span
    clips = min(clips, last + 1)  # no more distinct starts than that: never a loop per clip asked for
    if clips == 1:
        starts = [last // 2]  # the middle of the video
    else:
        starts = sorted({round(i * last / (clips - 1)) for i in range(clips)})
    return [[s + j * stride for j in range(frames)] for s in starts]


def probe(path: Path) -> VideoInfo:
    """Frame count, rate and size of ``path`` (a video file, or a folder of frames)."""
    if path.is_dir():
        from inspect_model.loading.images import _walk_images

        files = _walk_images(path)
        if not files:
            raise InputError(f"folder '{path}' holds no frames (image files)")
        from inspect_model.loading.images import header_size

        try:
            w, h = header_size(files[0], "frame")  # a regular file, its header only
        except OSError as exc:
            raise InputError(f"frame '{files[0]}' is not an image Pillow can read") from exc
        _check_frame_size(f"frame '{files[0]}'", w, h)
        return VideoInfo(path, len(files), None, w, h, tuple(files))
    av = require_av()
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"video '{path}' cannot be read: {exc.strerror or exc}") from exc
    if not path.is_file():
        from inspect_model.loading.parsing import NOT_REGULAR

        raise InputError(f"video '{path}' {NOT_REGULAR}")
    if size == 0:
        raise InputError(f"video '{path}' is an empty file")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise InputError(f"'{path}' holds no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else None
            frames = int(stream.frames or 0)
            if frames <= 0:  # mkv, webm, gif: no count in the header; count packets (no decoding)
                frames = sum(1 for p in container.demux(stream) if p.size)
            w, h = int(stream.codec_context.width), int(stream.codec_context.height)
    except InputError:
        raise
    except Exception as exc:  # av.error.FFmpegError and friends: a corrupt or unknown file
        raise InputError(f"video '{path}' is corrupt or not a video PyAV can read ({_reason(exc)})") from exc
    if frames <= 0 or w <= 0 or h <= 0:
        raise InputError(f"video '{path}' holds no decodable frame")
    _check_frame_size(f"video '{path}'", w, h)
    return VideoInfo(path, frames, fps, w, h)


def _check_frame_size(what: str, w: int, h: int) -> None:
    """A frame over the image limit is refused from the header, before any is decoded (a
    200-byte GIF may declare a 12000x12000 screen: 8.8 GiB once its frames are kept)."""
    from inspect_model.loading.images import MAX_PIXELS

    if w * h > MAX_PIXELS:
        raise InputError(f"{what} has frames of {w}x{h} pixels, over the {MAX_PIXELS:,}-pixel safety limit "
                         "that every picture has (decompression-bomb guard); scale the video down first")


def frame_budget(count: int) -> int:
    """Pixels each of ``count`` frames kept at once may have: together no more than one
    picture at the image limit (frames beyond it are downscaled as they are decoded)."""
    from inspect_model.loading.images import MAX_PIXELS

    return max(MAX_PIXELS // max(count, 1), 64 * 64)


def fit_size(w: int, h: int, budget: int) -> tuple[int, int]:
    """``(w, h)``, or scaled down (aspect kept) to at most ``budget`` pixels."""
    if w * h <= budget:
        return w, h
    scale = (budget / (w * h)) ** 0.5
    return max(1, int(w * scale)), max(1, int(h * scale))


def _reason(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:120]


@dataclass
class Frame:
    """One decoded frame: the picture (RGB) and when it is shown (seconds; None for a folder)."""

    index: int
    image: Image.Image
    time: float | None


def read_frames(info: VideoInfo, indices: Sequence[int]) -> list[Frame]:
    """The frames ``indices`` (sorted, unique, within the video), decoded from a seek to the
    first one up to the last one; nothing before or after is decoded."""
    wanted = sorted(set(indices))
    budget = frame_budget(len(wanted))
    if info.frame_files:
        from inspect_model.loading.images import load_image

        out = []
        for i in wanted:  # each one downscaled before the next is read
            img = load_image(info.frame_files[i]).image
            size = fit_size(*img.size, budget)
            out.append(Frame(i, img if size == img.size else img.resize(size), None))
        return out
    av = require_av()
    try:
        with av.open(str(info.path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            got = _decode_range(container, stream, wanted, info)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"video '{info.path}' is corrupt or truncated ({_reason(exc)})") from exc
    missing = [i for i in wanted if i not in got]
    if missing:
        have = max(got) + 1 if got else 0
        raise InputError(f"video '{info.path}' is truncated: frame {missing[0]} cannot be decoded "
                         f"(its header says {info.frames} frames, {have} could be read)")
    return [got[i] for i in wanted]


def _decode_range(container: Any, stream: Any, wanted: list[int], info: VideoInfo) -> dict[int, Frame]:
    """Seek to the key frame before ``wanted[0]``, then decode forward, keeping ``wanted``.
    A frame's index comes from its time stamp at the stream's rate; where there is no
    constant rate (GIF) or the seek lands after the first frame wanted, decode from the
    start counting frames instead."""
    tb = stream.time_base
    start = stream.start_time or 0
    seekable = info.fps is not None and tb is not None and container.format.name not in ("gif",)
    if seekable and wanted[0] > 0:
        target = start + int(wanted[0] / info.fps / float(tb))
        container.seek(target, stream=stream, backward=True, any_frame=False)
        got = _collect(container, stream, wanted, lambda f, n: round((f.pts - start) * float(tb) * info.fps))
        if got is not None:
            return got
        container.seek(start, stream=stream, backward=True, any_frame=False)
    got = _collect(container, stream, wanted, lambda f, n: n)
    return got or {}


def _collect(container: Any, stream: Any, wanted: list[int], index_of: Any) -> dict[int, Frame] | None:
    """Decode forward keeping ``wanted``; None when the first frame decoded is already past
    ``wanted[0]`` (a seek that overshot)."""
    keep = set(wanted)
    budget = frame_budget(len(wanted))
    out: dict[int, Frame] = {}
    n = 0
    for frame in container.decode(stream):
        i = index_of(frame, n) if frame.pts is not None else n
        n += 1
        if not out and i > wanted[0] and n == 1:
            return None
        if i in keep and i not in out:
            t = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else None
            w, h = fit_size(int(frame.width), int(frame.height), budget)  # scaled by FFmpeg as it converts
            out[i] = Frame(i, frame.to_image(width=w, height=h).convert("RGB"), t)
        if i >= wanted[-1]:
            break
    return out


@dataclass
class LoadedClip:
    """One clip of a video: display copies of its frames and where they came from. ``image``
    (the middle frame) and ``path`` let image-drawing code treat a clip as its middle frame."""

    path: Path
    clip: int  # clip number within the video (0..K-1)
    frame_indices: list[int]
    times: list[float | None]
    frames: list[Image.Image]  # display copies, at most DISPLAY_SIDE pixels a side
    size: tuple[int, int]  # the video's frame size (width, height)
    video_frames: int
    fps: float | None
    warnings: list[str] = field(default_factory=list)
    original_mode: str = "RGB"

    @property
    def image(self) -> Image.Image:
        return self.frames[len(self.frames) // 2]

    def describe(self) -> dict[str, Any]:
        return {"video": str(self.path), "clip": self.clip, "frames": list(self.frame_indices),
                "times": [None if t is None else round(t, 6) for t in self.times],
                "video_frames": self.video_frames, "fps": self.fps}


def display_copy(img: Image.Image) -> Image.Image:
    w, h = img.size
    scale = DISPLAY_SIDE / max(w, h)
    if scale >= 1:
        return img.copy()
    return img.resize((max(1, round(w * scale)), max(1, round(h * scale))))
