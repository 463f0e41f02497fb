"""Pictures inside a resumable state, kept as tensors rather than pickled PIL images (issue 41).

Unpickling a ``PIL.Image.Image`` allocates the size its pickle declares (60000x60000: 5.5 GiB)
before the pixels are read; a tensor cannot claim more than its storage, whose bytes are
in the file and bounded by the torch loader. :func:`store` turns every PIL image inside
rows of plain data into a :class:`StoredPicture`; :func:`restore` turns them back, each
checked (mode, shape, dtype, pixel count against the image limit) before a pixel is copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Channels of the modes a thumbnail or contact-sheet cell may have.
_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


@dataclass
class StoredPicture:
    """A PIL image as its mode and its pixels, a (H, W) or (H, W, C) uint8 tensor."""

    mode: str
    pixels: Any  # torch.Tensor


def store(value: Any) -> Any:
    """``value`` with every PIL image in its lists and tuples replaced by a :class:`StoredPicture`."""
    from PIL import Image

    if isinstance(value, Image.Image):
        import numpy as np
        import torch

        img = value if value.mode in _CHANNELS else value.convert("RGB")
        return StoredPicture(img.mode, torch.from_numpy(np.array(img, dtype=np.uint8)))
    if isinstance(value, tuple):
        return tuple(store(v) for v in value)
    if isinstance(value, list):
        return [store(v) for v in value]
    return value


def restore(value: Any, *, max_pixels: int) -> Any:
    """The inverse of :func:`store`; ``ValueError`` for a picture that is not one we stored."""
    if isinstance(value, StoredPicture):
        return _picture(value, max_pixels)
    if isinstance(value, tuple):
        return tuple(restore(v, max_pixels=max_pixels) for v in value)
    if isinstance(value, list):
        return [restore(v, max_pixels=max_pixels) for v in value]
    return value


def _picture(p: StoredPicture, max_pixels: int) -> Any:
    import torch
    from PIL import Image

    px = getattr(p, "pixels", None)
    channels = _CHANNELS.get(getattr(p, "mode", None))  # type: ignore[arg-type]
    if channels is None or not isinstance(px, torch.Tensor) or px.dtype != torch.uint8:
        raise ValueError("a stored picture is not an 8-bit L, RGB or RGBA image")
    shape = tuple(px.shape)
    if len(shape) != (2 if channels == 1 else 3) or (channels > 1 and shape[2] != channels):
        raise ValueError(f"a stored {p.mode} picture has shape {list(shape)}")
    if shape[0] < 1 or shape[1] < 1 or shape[0] * shape[1] > max_pixels:
        raise ValueError(f"a stored picture is {shape[1]}x{shape[0]} pixels, over the {max_pixels:,}-pixel limit")
    return Image.fromarray(px.contiguous().numpy())  # (H, W) L, (H, W, 3) RGB, (H, W, 4) RGBA
