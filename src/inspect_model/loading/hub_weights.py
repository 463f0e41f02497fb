"""torchvision weights from torch's hub cache, read without running code (issue 13).

torchvision loads cached weights with ``weights_only=False`` and does not check the hash
of a file already in the cache, so a poisoned cache file would run code under
``--weights DEFAULT``. Here the file is checked against the sha256 prefix torchvision puts
in its name (``resnet18-f37072fd.pth``) and read with ``torch.load(weights_only=True)``;
:func:`verified_weights` makes torchvision's builders use that reader.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from typing import Any

from inspect_model.errors import ModelLoadError, one_line

# torch.hub's own convention: the hex digits between the last '-' and the extension.
_HASH = re.compile(r"-([a-f0-9]{6,64})\.")


def expected_prefix(path: str) -> str | None:
    m = _HASH.search(os.path.basename(path))
    return m.group(1) if m else None


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_weights_file(path: str, *, mmap: bool = False) -> dict[str, Any]:
    """The state_dict in cached weights file ``path``, after checking its hash; never unpickles.
    ``mmap``: a torch.save archive is memory-mapped (its tensors read only where touched: an
    empty build, whose parameters are on the meta device, reads only the buffers)."""
    import pickle

    prefix = expected_prefix(path)
    if prefix is None:
        raise ModelLoadError(f"weights file {path} has no sha256 prefix in its name; delete it to download again")
    from inspect_model.loading.torch_files import check_regular

    check_regular(path, "weights file")  # a pipe in the cache would block the hash
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise ModelLoadError(f"weights file {path} cannot be read: {exc.strerror or exc}") from exc
    if not digest.startswith(prefix):
        raise ModelLoadError(
            f"weights file {path} does not match its sha256 prefix {prefix} (got {digest[:len(prefix)]}): "
            "it is corrupt or was tampered with; delete it to download again, or run with --weights none"
        )
    from inspect_model.loading.torch_files import load_torch

    try:
        with open(path, "rb") as fh:
            zipped = fh.read(2) == b"PK"  # torch maps only zip archives, not legacy pickles
        return load_torch(path, "weights file", mmap=mmap and zipped)  # type: ignore[no-any-return]
    except pickle.UnpicklingError as exc:
        raise ModelLoadError(
            f"weights file {path} holds Python objects, not just tensors, and is refused; "
            "delete it to download again"
        ) from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ModelLoadError(f"weights file {path} cannot be read: {one_line(exc)}") from exc


@contextlib.contextmanager
def verified_weights(path: str, *, mmap: bool = False) -> Iterator[None]:
    """Within this context torchvision's ``WeightsEnum.get_state_dict`` reads ``path``
    with :func:`read_weights_file` instead of torch.hub's unpickling loader."""
    from torchvision.models._api import WeightsEnum

    real = WeightsEnum.get_state_dict

    def get_state_dict(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return read_weights_file(path, mmap=mmap)

    WeightsEnum.get_state_dict = get_state_dict  # type: ignore[method-assign]
    try:
        yield
    finally:
        WeightsEnum.get_state_dict = real  # type: ignore[method-assign]
