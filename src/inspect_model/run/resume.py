"""``--resume``: the state a run keeps in its output directory, and reading it back.

The staging folder has a fixed name (:data:`RESUME_DIR`) and survives a failed or killed
run. After every batch (or every ``INSPECT_MODEL_CHECKPOINT_SECONDS``) each rank writes,
atomically, its state (``state-R.pt``, read back with ``weights_only=True`` and our own
record classes only) and its manifest (``manifest-R.json``: command, options hash, world
size, finished images). A later run of the same command and options goes on after the last
finished batch; other options, or another world size, are refused with a message.

The output directory is no trusted file (README recommends a shared file system for
multi-node runs, which others may write): everything read back from it is checked before
it is used (issue 28). Every staged-file pair must lie inside the directory (symlinks
resolved; :meth:`inspect_model.output.files.OutputDir.adopt` holds that), every count and
index must be in range; a state that is not is refused with one line (exit 7), nothing moved.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from inspect_model.errors import OutputError, UsageError, one_line
from inspect_model.output.files import RESUME_STAGING

RESUME_DIR = RESUME_STAGING  # OutputDir.MARKER prefix: ignored by the emptiness check, kept by the stale clean-up
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest lists the finished images' paths: a few KiB each 1,000


def fingerprint(command: str, options: dict[str, Any]) -> str:
    """A hash of the command and its resolved options (the report's ``options``), not the device."""
    base = {k: v for k, v in options.items() if k != "device"}
    text = json.dumps([command, base], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- files
def atomic_write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file and a rename. A failed write (a full
    disk, a file-size limit: EFBIG) leaves no temporary file and is an :class:`OutputError`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write the resume state '{path}': {exc.strerror or one_line(exc)}") from exc


def state_classes() -> list[type]:
    """The package's own record classes (dataclasses and :class:`Warnings`): the only
    globals a resume state's loader accepts (nothing in the output directory may run code,
    and building one of our records runs none)."""
    import dataclasses
    import sys

    from inspect_model.render.stored_pictures import StoredPicture
    from inspect_model.run.session import Warnings

    # No PIL image: its unpickling allocates the size the file declares (issue 41); pictures
    # travel as StoredPicture tensors, which cannot claim more than the bytes in the file.
    out: list[type] = [Warnings, StoredPicture]
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("inspect_model."):
            continue
        out += [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == name
                and dataclasses.is_dataclass(v)]
    return out


def save_state(path: Path, state: dict[str, Any]) -> None:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(path, buf.getvalue())


MAX_STATE_BYTES = 16 * 2**30  # summed gradients of a large model and every record: more is no state of ours
STATE_PICKLE_PER_IMAGE = 64 * 2**10  # records of one finished image, pickled (a few KiB in practice)


def load_state(path: Path, images: int = 0) -> dict[str, Any]:
    """The state at ``path`` through the bounded torch loader (regular file, size, inflated
    size, and a pickle of at most 32 MiB plus :data:`STATE_PICKLE_PER_IMAGE` per image of
    the shard), with our record classes only."""
    import torch

    from inspect_model.errors import InspectModelError
    from inspect_model.loading import archive_guard
    from inspect_model.loading.torch_files import load_torch

    try:
        with torch.serialization.safe_globals(state_classes()):
            state = load_torch(path, "resume state", error=OutputError, max_bytes=MAX_STATE_BYTES,
                               max_pickle=archive_guard.MAX_PICKLE_BYTES + STATE_PICKLE_PER_IMAGE * images)
    except InspectModelError as exc:  # a bomb or a pipe: the loader's words, this folder's fix
        raise bad_state(path, str(exc).removeprefix(f"resume state '{path}'").lstrip(": ")) from exc
    except Exception as exc:  # a damaged or foreign file: say which, never run it
        raise OutputError(f"cannot read the resume state '{path}' ({type(exc).__name__}); "
                          "remove that folder to start over") from exc
    if not isinstance(state, dict):
        raise bad_state(path, "not a dictionary")
    return state


def bad_state(where: Path | str, what: str) -> OutputError:
    return OutputError(f"the resume state '{where}' is not valid ({what}); remove that folder to start over")


def count(value: Any, what: str, high: int | None = None, *, where: Path | str = "") -> int:
    """``value`` as a count read back from a resume state: a whole number in [0, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (high is not None and value > high):
        bound = f" in 0..{high}" if high is not None else ""
        raise bad_state(where, f"{what} is {value!r}, not a whole number{bound}")
    return value


def strings(value: Any, what: str, *, where: Path | str = "", width: int | None = None) -> list[Any]:
    """``value`` as a list of strings (``width``: of tuples of that many strings)."""
    def ok(v: Any) -> bool:
        if width is None:
            return isinstance(v, str)
        return isinstance(v, (list, tuple)) and len(v) == width and all(isinstance(x, str) for x in v)

    if not isinstance(value, list) or not all(ok(v) for v in value):
        raise bad_state(where, f"{what} is not a list of {'texts' if width is None else f'{width}-tuples of texts'}")
    return value


# ----------------------------------------------------------------------------- checkpoints
class Checkpoint:
    """Writes this rank's state and manifest after each finished batch (``--resume``)."""

    def __init__(self, staging: Path, rank: int, size: int, command: str, fp: str, shard_paths: list[str]) -> None:
        from inspect_model.settings import env_float

        self.staging, self.rank, self.size = staging, rank, size
        self.command, self.fp, self.paths = command, fp, shard_paths
        self.every = env_float("INSPECT_MODEL_CHECKPOINT_SECONDS", 0.0)
        self.last = 0.0

    def due(self) -> bool:
        """Whether the next :meth:`save` writes (its state is only built then: grads copies gradients)."""
        return not self.every or time.monotonic() - self.last >= self.every

    def save(self, done: int, state: dict[str, Any], *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and self.every and now - self.last < self.every:
            return
        self.last = now
        save_state(self.staging / f"state-{self.rank}.pt", {**state, "done": done})
        manifest = {"manifest_version": MANIFEST_VERSION, "command": self.command, "options_hash": self.fp,
                    "world_size": self.size, "rank": self.rank, "done": done, "total": len(self.paths),
                    "images": self.paths[:done]}
        atomic_write(self.staging / f"manifest-{self.rank}.json",
                     (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def read_resume(staging: Path, rank: int, fp: str, command: str, size: int, out_path: Path,
                shard_len: int) -> dict[str, Any] | None:
    """This rank's saved state, checked (see the module docstring), or None to start afresh."""
    manifests = sorted(staging.glob("manifest-*.json"))
    if not manifests:
        return None
    from inspect_model.loading.parsing import loads_json, read_bounded

    where = f"resume manifest '{manifests[0]}'"
    try:  # bounded: a FIFO would block in open(), a link to /dev/zero read without end (issue 41)
        first = loads_json(read_bounded(manifests[0], where, error=OutputError, limit=MAX_MANIFEST_BYTES),
                           where, error=OutputError)
    except OSError as exc:
        raise OutputError(f"cannot read the {where}: {exc.strerror or one_line(exc)}; "
                          "remove that folder to start over") from exc
    except OutputError as exc:
        raise OutputError(f"{exc}; remove that folder to start over") from exc
    if not isinstance(first, dict):
        raise bad_state(manifests[0], "not a JSON object")
    if first.get("command") != command or first.get("options_hash") != fp:
        raise UsageError(f"output directory '{out_path}' holds an unfinished '{first.get('command')}' run with "
                         "other options; repeat its exact command to resume it, or choose another --output-dir")
    if first.get("world_size") != size:
        raise UsageError(f"the unfinished run in '{out_path}' was started with {first.get('world_size')} "
                         f"process(es), this one has {size}; resume it with the same number "
                         "(torchrun --nproc-per-node/--nnodes)")
    path = staging / f"state-{rank}.pt"
    if not path.exists():
        return None
    if path.is_symlink() or not path.is_file():
        raise bad_state(path, "not a regular file")
    state = load_state(path, shard_len)
    count(state.get("done"), "the number of finished images", shard_len, where=path)
    strings(state.get("skipped"), "the skipped inputs", where=path, width=2)
    strings(state.get("pending"), "the staged files", where=path, width=2)
    strings(state.get("written"), "the files written", where=path)
    if not isinstance(state.get("session"), dict):
        raise bad_state(path, "no session state")
    state["where"] = str(path)
    return state
