"""Output directories that a pipeline can trust: all files of a run, or none.

``OutputDir`` checks the directory before any work starts (not a file, writable, empty
unless ``force``), stages every file of the run in a hidden folder inside it, and only on
``commit()`` renames them into place. If the run fails, ``abort()`` removes the staging
folder, and the directory itself when the run created it. Names derived from layer or file
names pass through :func:`safe_name`, so they can never escape the directory.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from inspect_model.errors import OutputError
from inspect_model.output.dirlock import RESUME_STAGING, STAGING_PREFIX, DirLock, hold_output_dir

__all__ = ["RESUME_STAGING", "DirLock", "OutputDir", "class_tag", "hold_output_dir", "image_dir", "png_bytes",
           "safe_name"]

_UNSAFE = re.compile(r"[^\w.#=+-]+")  # \w: letters and digits of any script (and _)
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, at a character boundary."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


def safe_name(text: str, *, default: str = "x", max_len: int = 120) -> str:
    """A file-name-safe version of ``text``: no separators, no leading dots, no '..'; letters
    of any script stay (``ünïcödé``, ``猫``), NFC-composed; at most ``max_len`` bytes of UTF-8
    (file systems count bytes).

    When cleaning changes the text, a short hash of the original is appended, so two names
    that clean alike ('a/b' and 'a_b') still give two files."""
    import unicodedata

    s = unicodedata.normalize("NFC", text)
    s = _UNSAFE.sub("_", s.replace(os.sep, "_").replace("/", "_").replace("\\", "_"))
    s = s.replace("..", "_").strip("._ ")
    if not s:
        s = default
    if s.split(".")[0].upper() in _RESERVED:
        s = "_" + s  # CON, NUL, COM1...: device names on Windows
    if s != text or len(s.encode("utf-8")) > max_len:
        import hashlib

        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return f"{_cut(s, max_len - 9)}-{digest}"
    return s


def image_dir(index: int, name: str) -> str:
    """The folder of one input's files: ``images/0003-cat``."""
    stem = Path(name).stem or name
    return f"images/{index:04d}-{safe_name(stem)}"


def class_tag(cls: int, categories: list[str] | None) -> str:
    """``c281-tabby``: the one way a class names a file."""
    if categories and 0 <= cls < len(categories) and categories[cls]:
        return safe_name(f"c{cls}-{categories[cls]}")
    return f"c{cls}"


_PNG_COLOUR_TYPE = {"L": 0, "RGB": 2, "LA": 4, "RGBA": 6}  # 8 bits per channel


def png_bytes(image: Any, *, photo: bool = False) -> bytes:
    """A PIL image as PNG bytes: no timestamp or other metadata, so the bytes depend on the
    pixels only, and fast (pictures are the cost of ``-o``, issue 15).

    8-bit L/LA/RGB/RGBA images are encoded here: every row with PNG's "Sub" filter (one
    numpy subtraction), then deflated by :func:`_deflater`. Pillow's encoder tries five
    filters on every row, which costs more than the compression itself (a 451x300 overlay:
    21 ms there, 7 ms with zlib here, files within a few percent). ``photo``: mostly a
    photograph (overlays), which zlib compresses 2x faster with its run-length strategy at
    the same size. Other modes go through Pillow (zlib level 1). numpy, zlib and ISA-L
    release the GIL, so this runs in parallel in a worker thread."""
    import struct

    import numpy as np

    colour = _PNG_COLOUR_TYPE.get(image.mode)
    if colour is None or 0 in image.size:  # (PNG has no empty image: Pillow says so)
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=1)
        return buf.getvalue()
    a = np.asarray(image)
    height, width = a.shape[:2]
    bpp = 1 if a.ndim == 2 else a.shape[2]
    rows = a.reshape(height, width * bpp)
    filtered = np.empty((height, width * bpp + 1), np.uint8)
    filtered[:, 0] = 1  # filter type "Sub": each byte minus the byte one pixel to its left
    filtered[:, 1:bpp + 1] = rows[:, :bpp]
    np.subtract(rows[:, bpp:], rows[:, :-bpp], out=filtered[:, bpp + 1:])
    compressobj, crc32 = _deflater(photo)
    z = compressobj()
    data = z.compress(filtered.data) + z.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc32(body, crc32(kind)))

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _deflater(photo: bool) -> tuple[Any, Any]:
    """``(compressobj factory, crc32)`` for PNG data: Intel's ISA-L (the ``isal`` package,
    installed with this tool where it has wheels) at its level 1, else zlib at level 1.
    ISA-L: a 451x300 overlay in 1.6 ms against zlib's 4.7 ms at the same size, a heat map
    with its colour bar 8x faster and 9% smaller (benchmarks/bench_pictures.py). Either
    gives a valid zlib stream; the bytes depend on the pixels and the encoder only."""
    import functools

    try:
        from isal import isal_zlib
    except ImportError:  # a platform without isal's wheels: the standard library's zlib
        import zlib

        strategy = zlib.Z_RLE if photo else zlib.Z_DEFAULT_STRATEGY
        return functools.partial(zlib.compressobj, 1, zlib.DEFLATED, 15, 9, strategy), zlib.crc32
    return functools.partial(isal_zlib.compressobj, 1, isal_zlib.DEFLATED, 15, 9), isal_zlib.crc32


class OutputDir:
    """A transaction over the files one run writes into ``path``."""

    MARKER = STAGING_PREFIX

    def __init__(self, path: str | os.PathLike[str], *, force: bool = False) -> None:
        self.path = Path(path)
        self.force = force
        self.created = False
        self.staging: Path | None = None
        self.written: list[str] = []  # final paths, as given in reports
        self._pending: list[tuple[Path, Path]] = []
        self._claimed: set[Path] = set()  # finals in _pending (a list search is quadratic over 10k files)
        self._last_parent: tuple[Path | None, Path | None] = (None, None)  # (folder, resolved) of _resolved
        self._real_root: Path | None = None
        self._lock: DirLock | None = None
        self._write_lock = threading.Lock()  # files are written from the Sink's worker threads

    # ------------------------------------------------------------ checks
    def prepare(self) -> OutputDir:
        """Lock, check and create the directory; raise :class:`OutputError` before any work."""
        p = self.path
        self._lock = DirLock.acquire(p, force=self.force)
        self.created = self._lock.owns_created
        if not os.access(p, os.W_OK | os.X_OK):
            self._release(failed=True)
            raise OutputError(f"output directory '{p}' is not writable; choose another --output-dir")
        try:
            self.staging = Path(tempfile.mkdtemp(prefix=self.MARKER, dir=p))
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write in output directory '{p}': {exc.strerror or exc}") from exc
        return self

    def _release(self, *, failed: bool) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release(failed=failed)

    # ------------------------------------------------------------ writing
    def _stage(self, relname: str) -> tuple[Path, Path]:
        if self.staging is None:
            self.prepare()
        assert self.staging is not None
        parts = [safe_name(part) for part in Path(relname).parts if part not in ("", ".", "..")]
        if not parts:
            raise OutputError(f"invalid output file name '{relname}'")
        final = self.path.joinpath(*parts)
        staged = self.staging.joinpath(*parts)
        # Defensive: resolved paths must stay inside the directory.
        if self._root() not in self._resolved(final).parents:
            raise OutputError(f"output name '{relname}' escapes the output directory")
        with self._write_lock:
            staged.parent.mkdir(parents=True, exist_ok=True)
        return staged, final

    def _root(self) -> Path:
        """The directory, resolved once (a run's files are checked against it)."""
        if self._real_root is None:
            self._real_root = self.path.resolve()
        return self._real_root

    def _resolved(self, final: Path) -> Path:
        """``final.resolve()``, its folder's resolution reused from the file before it (an
        image's files share one: half the ``lstat`` calls on the main thread, issue 40)."""
        if final.is_symlink():
            return final.resolve()
        parent, real = self._last_parent
        if parent != final.parent:
            parent, real = final.parent, final.parent.resolve()
            self._last_parent = (parent, real)
        return real / final.name

    def reserve(self, relname: str) -> tuple[Path, Path]:
        """Claim ``relname`` now (reports list it; commit moves it) and give the (staged,
        final) paths; :meth:`write_staged` fills it later, from any thread."""
        staged, final = self._stage(relname)
        with self._write_lock:
            if final not in self._claimed:  # the same name written twice: last wins
                self._claimed.add(final)
                self._pending.append((staged, final))
                self.written.append(str(final))
        return staged, final

    def adopt(self, pending: list[tuple[Path, Path]], written: list[str]) -> None:
        """Take over files staged elsewhere (a resumed run's, other ranks', renamed pages):
        ``pending`` (staged, final) pairs and the ``written`` list that reports give.

        What comes from a resume state was read back from the directory, which is no trusted
        file (issue 28): every staged file must lie in this run's staging folder and every
        final one in the directory, outside any staging folder, symlinks resolved; else
        :class:`OutputError` and nothing is taken (nothing has moved)."""
        pairs = [(Path(a), Path(b)) for a, b in pending]
        for staged, final in pairs:
            self._check_inside(staged, staged=True)
            self._check_inside(final, staged=False)
        for w in written:
            self._check_inside(Path(w), staged=False)
        with self._write_lock:
            self._pending = pairs
            self._claimed = {final for _, final in self._pending}
            self.written = list(written)

    def _check_inside(self, path: Path, *, staged: bool) -> None:
        root = self.path.resolve()
        real = Path(os.path.realpath(path))
        if staged:
            home = Path(os.path.realpath(self.staging)) if self.staging is not None else None
            ok = home is not None and home in real.parents
        else:
            ok = root in real.parents and not real.relative_to(root).parts[0].startswith(self.MARKER)
        if not ok:
            where = "this run's staging folder" if staged else "the output directory"
            raise OutputError(f"the resume state names the file '{path}', which lies outside {where} "
                              f"'{self.staging if staged else self.path}'; the state is not this tool's: "
                              "remove the staging folder to start over")

    def state_dict(self) -> dict[str, Any]:
        """The files staged so far, as (staged, final) texts, and the written list: a resume state's part."""
        with self._write_lock:
            return {"pending": [(str(a), str(b)) for a, b in self._pending], "written": list(self.written)}

    def pending(self) -> list[tuple[Path, Path]]:
        with self._write_lock:
            return list(self._pending)

    @staticmethod
    def write_staged(staged: Path, final: Path, data: bytes) -> str:
        try:
            with open(staged, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise OutputError(f"cannot write '{final}': {exc.strerror or exc}") from exc
        return str(final)

    def write_bytes(self, relname: str, data: bytes) -> str:
        staged, final = self.reserve(relname)
        return self.write_staged(staged, final, data)

    def write_text(self, relname: str, text: str) -> str:
        return self.write_bytes(relname, text.encode("utf-8"))

    def save_npy(self, relname: str, array: Any) -> str:
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, np.asarray(array), allow_pickle=False)
        return self.write_bytes(relname, buf.getvalue())

    # ------------------------------------------------------------ ending
    def commit(self) -> list[str]:
        """Move every staged file into place: all of them, or (on failure) none, with any
        file they were replacing put back."""
        assert self.staging is not None or not self._pending
        moved: list[tuple[Path, Path | None]] = []  # (final, backup of what it replaced)
        made: list[Path] = []
        try:
            for i, (staged, final) in enumerate(self._pending):
                parent = final.parent
                missing = []
                while not parent.exists():
                    missing.append(parent)
                    parent = parent.parent
                final.parent.mkdir(parents=True, exist_ok=True)
                made.extend(reversed(missing))
                backup = None
                if final.exists():
                    assert self.staging is not None
                    backup = self.staging / f".replaced-{i}"
                    os.replace(final, backup)
                moved.append((final, backup))
                os.replace(staged, final)
        except OSError as exc:
            for final, backup in reversed(moved):
                try:
                    final.unlink(missing_ok=True)
                    if backup is not None:
                        os.replace(backup, final)
                except OSError:
                    pass
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    pass
            self.abort()
            raise OutputError(f"cannot move outputs into '{self.path}': {exc.strerror or exc}") from exc
        self._pending.clear()
        self._claimed.clear()
        self._cleanup_staging()
        self._release(failed=False)
        return list(self.written)

    def abort(self) -> None:
        """Forget the run: remove staged files, and the directory if this run created it."""
        self._pending.clear()
        self._claimed.clear()
        self.written.clear()
        self._cleanup_staging()
        self.created = False
        self._release(failed=True)  # removes the directory if this run created it

    def leave(self) -> None:
        """Stop without committing, keeping the staging folder (a resumable run's state for
        the next try): only the lock is released."""
        with self._write_lock:
            self._pending.clear()
            self._claimed.clear()
        self.staging = None
        if self._lock is not None:
            self._lock.created_top = None  # the directory holds the state now: whoever made it keeps it
        self._release(failed=False)

    def _cleanup_staging(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None

    def __enter__(self) -> Self:
        return self.prepare()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.abort()
        elif self._pending:
            self.commit()
        else:
            self._cleanup_staging()
            self._release(failed=False)
