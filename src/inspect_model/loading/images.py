"""Image files: finding them and decoding them, before any preprocessing.

``collect_paths`` expands what the user typed (files, directories, globs, ``-`` for stdin)
into a list of files. ``load_image`` decodes one file with Pillow into a :class:`LoadedImage`
(EXIF orientation applied, any mode converted to RGB or L by ``_convert``), checking the
size from the header first against ``MAX_PIXELS`` (the decompression-bomb guard) and
``MIN_SIDE``; every failure is a one-line :class:`InputError` naming the file. Turning the
images into model inputs lives in :mod:`inspect_model.loading.inputs`.
"""

from __future__ import annotations

import glob
import itertools
import os
import stat
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, one_line
from inspect_model.loading.parsing import NOT_REGULAR

if TYPE_CHECKING:
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


def collect_paths(items: Sequence[str], *, stdin: Any = None,
                  missing: list[tuple[str, str]] | None = None, exclude: Any = None,
                  excluded: list[Path] | None = None) -> list[Path]:
    """Expand files, directories (recursively, sorted), globs and ``-`` (paths on stdin, one
    per line or NUL-separated as ``find -print0`` writes them). Hidden files and folders
    inside a directory are left out (macOS ``._name.jpg`` files are not images); a file
    named twice is kept once, where it first appears. With ``missing`` (``--skip-bad-inputs``)
    a path that does not exist is recorded there instead of raising.

    Directories and globs leave out what lies under ``exclude`` (the run's output directory:
    a second run into a folder inside its input folder would read the first one's pictures
    as inputs); those files go to ``excluded``. A file named on its own is kept, and so is
    everything when the output directory is the input folder itself (or holds it)."""
    cut = _under(exclude, excluded)
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
            out.extend(collect_paths(lines, missing=missing, exclude=exclude, excluded=excluded))
            continue
        p = Path(item)
        if p.is_dir():
            found = cut(_walk_images(p), p)
            if not found and not os.access(p, os.R_OK | os.X_OK):
                raise InputError(f"directory '{item}' cannot be read (permission denied)")
            if not found:
                raise InputError(
                    f"directory '{item}' holds no images ({', '.join(sorted(IMAGE_EXTENSIONS)[:6])}, ...)"
                )
            out.extend(found)
        elif p.exists():
            out.append(p)
        elif any(c in item for c in "*?["):
            found = cut(sorted(Path(f) for f in glob.glob(item, recursive=True) if os.path.isfile(f)), _glob_base(item))
            if not found:
                raise InputError(f"pattern '{item}' matches no file")
            out.extend(found)
        elif missing is not None:
            missing.append((item, "does not exist"))
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


def _inside(path: Any, folder: str) -> bool:
    return os.path.commonpath([folder, os.path.realpath(path)]) == folder


def _glob_base(pattern: str) -> str:
    """The folder a glob pattern searches from: its parts before the first wildcard."""
    parts = Path(pattern).parts
    fixed = list(itertools.takewhile(lambda p: not glob.has_magic(p), parts))
    return str(Path(*fixed)) if fixed else "."


def _under(exclude: Any, excluded: list[Path] | None) -> Any:
    """A filter ``cut(paths, base)`` dropping the paths in folder ``exclude`` (recorded in
    ``excluded``) when that folder lies strictly inside ``base``, the folder searched."""
    if exclude is None:
        return lambda paths, base: paths
    root = os.path.realpath(exclude)

    def keep(paths: list[Path], base: Any) -> list[Path]:
        if _inside(base, root):  # -o is the input folder (or above it): nothing to tell apart
            return paths
        kept = []
        for p in paths:
            if _inside(p, root):
                if excluded is not None:
                    excluded.append(p)
            else:
                kept.append(p)
        return kept
    return keep


def _walk_images(root: Path) -> list[Path]:
    found: list[Path] = []

    def unreadable(exc: OSError) -> None:
        raise InputError(f"directory '{exc.filename}' cannot be read ({exc.strerror or exc})")

    for folder, dirs, files in os.walk(root, onerror=unreadable):  # symlinks to folders not followed
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


def load_image(path: Path, *, channels: int = 3, resize: int | None = None) -> LoadedImage:
    """Decode ``path`` to an RGB (or L for 1-channel models) image; one-line errors that
    name the file. The size is checked from the header before any pixel is decoded, and so
    is the size after the planned resize of the shorter side to ``resize`` pixels (a 16x400000
    strip grows 16 times: issue 13)."""
    from PIL import Image, ImageOps

    notes: list[str] = []
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(f"image '{path}' cannot be read: {exc.strerror or exc}") from exc
    size = st.st_size
    if path.is_dir():
        raise InputError(f"image '{path}' is a directory")
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the run (or read as "empty"), a device never end
        raise InputError(f"image '{path}' {NOT_REGULAR}")
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
                if resize and min(w, h) >= MIN_SIDE:
                    scale = resize / min(w, h)
                    rw, rh = max(resize, round(w * scale)), max(resize, round(h * scale))
                    if rw * rh > MAX_PIXELS:
                        raise InputError(
                            f"image '{path}' is {w}x{h} pixels; resized to {resize} pixels on its shorter "
                            f"side it would be {rw}x{rh}, over the {MAX_PIXELS:,}-pixel safety limit "
                            f"(about {rw * rh * 4 / 2**30:.1f} GiB as floats); crop it first or pass a smaller --resize"
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
        reason = one_line(exc)
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


def header_size(path: Path | str, what: str = "image") -> tuple[int, int]:
    """``(width, height)`` from the header of the image file at ``path``, nothing decoded: a
    regular file only (a FIFO would block in ``open()``), no Pillow bomb warning or error (the
    callers hold the size to :data:`MAX_PIXELS` in their own words). ``OSError`` when it is
    no image Pillow reads, :class:`InputError` when it is no regular file."""
    from PIL import Image

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} '{path}' {NOT_REGULAR}")
    old_max = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as im:
                return int(im.size[0]), int(im.size[1])
    except (SyntaxError, ValueError, EOFError) as exc:
        raise OSError(str(exc)) from exc
    finally:
        Image.MAX_IMAGE_PIXELS = old_max


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

