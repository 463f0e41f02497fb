"""Output directories held for a whole run: an advisory lock between processes.

``flock`` on the directory's own file descriptor (POSIX). Where there is no ``fcntl``
(Windows) the lock degrades cleanly: a process still counts its own holds, but two
processes on one directory are not kept apart (README says so).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from inspect_model.errors import OutputError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

STAGING_PREFIX = ".inspect-model-staging-"  # a run's staging folders: ignored by the emptiness check

_HELD: dict[str, DirLock] = {}  # real path -> the lock this process holds on it


RESUME_STAGING = ".inspect-model-staging-resume"  # --resume's state: survives a failed run


class DirLock:
    """An advisory lock (``flock``) on an output directory, held for a whole run (issue 13).

    A second run on the same directory is refused at once, or waits with ``wait=True``.
    The lock is per process and counted: the CLI takes it before loading the model and the
    :class:`OutputDir` of the run shares it. Whoever holds it may remove the staging folders
    it finds (their runs are dead) and, on failure, the directory if the run created it.
    """

    def __init__(self, path: Path, fd: int | None, created_top: Path | None) -> None:
        self.path = path
        self.fd = fd
        self.created_top = created_top  # the top-most folder this run created, or None
        self.count = 1

    @property
    def owns_created(self) -> bool:
        return self.created_top is not None

    @classmethod
    def acquire(cls, path: str | os.PathLike[str], *, wait: bool = False, force: bool = False) -> DirLock:
        p = Path(path)
        key = os.path.realpath(p)
        held = _HELD.get(key)
        if held is not None:
            held.count += 1
            return held
        if p.exists() and not p.is_dir():
            raise OutputError(f"output directory '{p}' is a file; choose another --output-dir")
        created_top = None
        while True:
            if not p.exists():
                created_top = _make_dir(p) or created_top
            try:
                fd = open_dir(p)
            except FileNotFoundError:
                continue  # removed under us by a failing run: make it again
            except OSError as exc:
                raise OutputError(f"cannot open output directory '{p}': {exc.strerror or exc}") from exc
            if fd is None:  # no flock here (not POSIX): runs on one directory are not kept apart
                break
            if not lock_fd(fd, wait=wait):
                os.close(fd)
                # Never remove a directory another run holds, even one this run just made.
                raise OutputError(
                    f"output directory '{p}' is in use by another inspect-model run; wait for it to "
                    "finish (or pass --wait), or choose another --output-dir"
                ) from None
            # The run we waited for may have removed the directory: then lock the new one.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(p))
            except OSError:
                same = False
            if same:
                break
            os.close(fd)
        lock = cls(p, fd, created_top)  # fd None: not POSIX, no lock between processes
        _HELD[key] = lock
        try:
            lock._clean_stale()
            entries = [e for e in os.listdir(p) if not e.startswith(STAGING_PREFIX)]
        except OSError as exc:
            lock.release(failed=True)
            raise OutputError(f"cannot read output directory '{p}': {exc.strerror or exc}") from exc
        if entries and not force:
            lock.release(failed=True)
            raise OutputError(
                f"output directory '{p}' is not empty ({len(entries)} entries); "
                "pass --force to write into it, or choose another --output-dir"
            )
        return lock

    def _clean_stale(self) -> None:
        """Staging folders of runs that died (kill -9): their lock is free, since we hold it."""
        for e in os.listdir(self.path):
            if e.startswith(STAGING_PREFIX) and e != RESUME_STAGING:  # --resume's state is kept
                shutil.rmtree(self.path / e, ignore_errors=True)

    def release(self, *, failed: bool) -> None:
        self.count -= 1
        if self.count > 0:
            return
        _HELD.pop(os.path.realpath(self.path), None)
        try:
            if failed and self.created_top is not None:
                # Still locked while removing: nobody else can have written here meanwhile.
                shutil.rmtree(self.created_top, ignore_errors=True)
        finally:
            if self.fd is not None:
                os.close(self.fd)  # closing releases the flock


def _make_dir(p: Path) -> Path | None:
    """Create ``p`` and its missing parents; the top-most folder created (None if another
    process made it first)."""
    top = p
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    try:
        p.mkdir(parents=True)
    except FileExistsError:
        if p.is_dir():
            return None
        if p.is_symlink():  # exists() is False for a link to nowhere, so mkdir found the link itself
            raise OutputError(f"output directory '{p}' is a symbolic link to '{os.readlink(p)}', which does not "
                              "exist; create that folder or choose another --output-dir") from None
        raise OutputError(f"output directory '{p}' lies under a file; choose another --output-dir") from None
    except NotADirectoryError as exc:
        raise OutputError(f"output directory '{p}' lies under a file; choose another --output-dir") from exc
    except OSError as exc:
        raise OutputError(f"cannot create output directory '{p}': {exc.strerror or exc}") from exc
    return top


@contextlib.contextmanager
def hold_output_dir(path: str | os.PathLike[str] | None, *, wait: bool = False,
                    force: bool = False) -> Iterator[None]:
    """Lock ``path`` for the whole of a run (the CLI wraps model loading and all in this);
    on failure, remove the directory if this run created it. ``None``: nothing to lock."""
    if path is None:
        yield
        return
    lock = DirLock.acquire(path, wait=wait, force=force)
    failed = True
    try:
        yield
        failed = False
    finally:
        lock.release(failed=failed)


def open_dir(path: Path) -> int | None:
    """A read-only descriptor of the directory ``path`` to lock, or None where directories
    cannot be locked (no ``fcntl``)."""
    if fcntl is None:
        if not path.is_dir():
            raise FileNotFoundError(str(path))
        return None
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def lock_fd(fd: int, *, wait: bool) -> bool:
    """Take the exclusive lock on ``fd`` (waiting with ``wait``); False if another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True
