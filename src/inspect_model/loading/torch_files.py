"""The one bounded loader of torch files: checkpoints, weights, inputs and baseline files,
TorchScript and exported archives, resume states (issue 41).

Before ``torch.load`` sees a byte, :func:`guard_torch_file` holds the file to four limits:
it is a regular file (a FIFO blocks in ``open()``, ``/dev/zero`` never ends); its size is
within the budget; its compressed records inflate to no more than the budget
(:func:`~inspect_model.loading.archive_guard.check_sizes`: zip bombs); and its pickle is
at most :data:`~inspect_model.loading.archive_guard.MAX_PICKLE_BYTES` (a few megabytes for a real state dict: a pickle of 600 MB
of list appends would take minutes in the weights-only unpickler and memory without end).
The pickle's size is read from the zip's directory (``data.pkl``, ``constants.pkl``) or,
for a legacy file, from where its pickles end (scanned, never run). :func:`load_torch` is
the guard, then ``torch.load(weights_only=True)``; every caller words torch's own errors.
"""

from __future__ import annotations

import os
import stat
import zipfile
from typing import Any

from inspect_model.errors import InputError, InspectModelError, ModelLoadError
from inspect_model.loading.parsing import NOT_REGULAR

from inspect_model.loading import archive_guard

_PICKLE_SUFFIXES = (".pkl",)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check_regular(path: str | os.PathLike[str], what: str, *, error: type[InspectModelError] = ModelLoadError,
                  max_bytes: int | None = None) -> int:
    """The size of the regular file at ``path``; ``error`` naming ``what`` when it is missing,
    a directory, a pipe or device, or over ``max_bytes``."""
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise error(f"{what} '{path}' does not exist") from exc
    except OSError as exc:
        raise error(f"{what} '{path}' cannot be read: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} '{path}' is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} '{path}' {NOT_REGULAR}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise error(f"{what} '{path}' is {_mib(st.st_size)}, over the {_mib(max_bytes)} it may take; "
                    "it is not read")
    return int(st.st_size)


def check_pickle_size(path: str, what: str, *, limit: int | None = None,
                      error: type[InspectModelError] = InputError) -> None:
    """Refuse a torch file whose pickle is over ``limit`` bytes (default
    :data:`archive_guard.MAX_PICKLE_BYTES`), before anything unpickles it: a zip's ``*.pkl``
    records by their declared size, a legacy file by where its pickles end."""
    limit = archive_guard.MAX_PICKLE_BYTES if limit is None else limit
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head == b"PK":
        try:
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            return  # the loaders say "truncated or corrupt" in their own words
        for info in infos:
            if info.filename.endswith(_PICKLE_SUFFIXES) and info.file_size > limit:
                raise error(f"{what} '{path}': its pickle '{info.filename}' is {_mib(info.file_size)}, over the "
                            f"{_mib(limit)} a state dict needs; refusing to unpickle it")
        return
    if head[:1] == b"\x80":
        end = archive_guard.legacy_pickle_end(path, limit)
        if end is None:
            raise error(f"{what} '{path}': its pickles run past {_mib(limit)}, more than a state dict needs; "
                        "refusing to unpickle it")


def guard_torch_file(path: str | os.PathLike[str], what: str, *, error: type[InspectModelError] = ModelLoadError,
                     budget: Any = None, max_bytes: int | None = None,
                     max_pickle: int | None = None) -> None:
    """Every limit (see the module docstring) on the torch file at ``path``; ``budget`` an
    :class:`~inspect_model.loading.archive_guard.SizeBudget` (default: from the file's size),
    whose total also bounds the file's own size. Zip bombs and oversized pickles are input
    errors (exit 4) as before; a file that is no regular file is ``error``."""
    path = str(path)
    limit = max_bytes if max_bytes is not None else (budget.total if budget is not None else None)
    check_regular(path, what, error=error, max_bytes=limit)
    check_pickle_size(path, what, limit=max_pickle)  # first: the legacy size scan reads the pickle
    archive_guard.check_sizes(path, budget, what=what)


def load_torch(path: str | os.PathLike[str], what: str, *, error: type[InspectModelError] = ModelLoadError,
               budget: Any = None, max_bytes: int | None = None, max_pickle: int | None = None,
               map_location: Any = "cpu", trust: bool = False, mmap: bool = False) -> Any:
    """:func:`guard_torch_file`, then ``torch.load`` (``weights_only=True`` unless ``trust``,
    which only ``--trust-checkpoint`` on the command line sets). torch's own exceptions
    propagate: the caller words them."""
    import torch

    guard_torch_file(path, what, error=error, budget=budget, max_bytes=max_bytes, max_pickle=max_pickle)
    if trust:
        return torch.load(str(path), map_location=map_location, weights_only=False)
    return torch.load(str(path), map_location=map_location, weights_only=True, mmap=mmap)  # mmap: zip archives only
