"""Where a run's files go: the :class:`Sink` (an output directory and a TensorBoard writer,
pictures encoded on a small pool of render threads) and the :class:`Drawer` protocol that
turns a session's records into files.

Sessions (``api/``) compute records; each command's drawer (``render/draw_*.py``) draws
an item's files as it comes (``draw``) and the run's pictures at the end (``draw_summary``).
``run/reports.py`` writes ``report.txt``/``.json``/``.html`` last, as they list every file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inspect_model.output.files import OutputDir


class Sink:
    """Where a session draws its files: an :class:`OutputDir` (names relative to it) and,
    optionally, a TensorBoard writer. ``files`` is every file written, relative.

    Pictures are encoded and written by a small pool of threads while the model computes
    the next batch (Pillow's and zlib's encoders and torch release the GIL). The queue is
    bounded (:data:`MAX_PENDING` jobs): a producer that runs ahead waits, so memory stays
    flat over any number of images. Names are claimed when a job is queued, so the
    reports list the same files in the same order whatever the threads do."""

    def __init__(self, out: OutputDir | None, writer: Any = None, *, workers: int | None = None) -> None:
        self.out = out
        self.writer = writer
        self.workers = render_workers() if workers is None else workers
        self._pool: Any = None
        self._slots: Any = None
        self._jobs: list[Any] = []

    @property
    def active(self) -> bool:
        return self.out is not None or self.writer is not None

    def relative(self, final: str | os.PathLike[str]) -> str:
        """A final path as the reports name it: relative to the output directory."""
        assert self.out is not None
        return Path(os.path.relpath(final, self.out.path)).as_posix()

    # ------------------------------------------------------------ the queue
    def defer(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on a worker thread (inline with ``workers=0``); a ``Future``. Waits
        while :data:`MAX_PENDING` jobs are queued; raises a finished job's error early."""
        from concurrent.futures import Future, ThreadPoolExecutor

        if self.workers <= 0:
            fut: Future[Any] = Future()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to whoever waits on the future, and raised
                fut.set_exception(exc)
                raise
            return fut
        if self._pool is None:
            import threading

            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="inspect-model-render",
                                            initializer=_lower_priority)
            self._slots = threading.BoundedSemaphore(MAX_PENDING)
        self._check()
        self._slots.acquire()
        try:
            fut = self._pool.submit(fn)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _f: self._slots.release())
        self._jobs.append(fut)
        return fut

    def _check(self) -> None:
        """Forget finished jobs; raise the first error among them."""
        keep = []
        for f in self._jobs:
            if not f.done():
                keep.append(f)
            elif f.exception() is not None:
                raise f.exception()
        self._jobs = keep

    def drain(self) -> None:
        """Wait for every queued job; raise the first error."""
        for f in self._jobs:
            f.result()
        self._jobs = []

    def close(self, *, cancel: bool = False) -> None:
        """Stop the workers (after the queued jobs, or dropping those not started)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None
        if cancel:
            self._jobs = []

    # ------------------------------------------------------------ files
    def image(self, rel: str, img: Any, *, photo: bool = False) -> str | None:
        """A PNG of ``img`` (a PIL image, or a function that draws one on the worker);
        ``photo``: mostly photographs (see ``png_bytes``)."""
        if self.out is None:
            return None
        from inspect_model.output.files import png_bytes

        staged, final = self.out.reserve(rel)
        write = self.out.write_staged
        self.defer(lambda: write(staged, final, png_bytes(img() if callable(img) else img, photo=photo)))
        return self.relative(str(final))

    def figure(self, rel: str, fig: Any, *, dpi: int = 100) -> str | None:
        """A matplotlib figure, rasterised here (matplotlib is not thread-safe), written on a worker."""
        if self.out is None:
            return None
        import io

        try:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
        finally:
            import matplotlib.pyplot as plt

            plt.close(fig)
        return self.data(rel, buf.getvalue())

    def npy(self, rel: str, array: Any) -> str | None:
        return None if self.out is None else self.relative(self.out.save_npy(rel, array))

    def data(self, rel: str, payload: bytes) -> str | None:
        if self.out is None:
            return None
        staged, final = self.out.reserve(rel)
        write = self.out.write_staged
        self.defer(lambda: write(staged, final, payload))
        return self.relative(str(final))

    def text(self, rel: str, payload: str) -> str | None:
        return None if self.out is None else self.relative(self.out.write_text(rel, payload))

    def written(self) -> list[str]:
        return [] if self.out is None else [self.relative(f) for f in self.out.written]


RENDER_NICE = 10  # render threads yield the cores to the threads that feed the model


def _lower_priority() -> None:
    """Run this render thread at a lower priority (Linux: nice is per thread): decoding the
    next images and the model's own threads come first, drawing takes what they leave."""
    import sys
    import threading

    if not sys.platform.startswith("linux"):  # elsewhere a thread id is no process id: never renice by it
        return
    try:
        tid = threading.get_native_id()  # never above the priority it has (a run already at nice 15)
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), RENDER_NICE))
    except OSError:  # not allowed: same priority as the rest
        pass


MAX_PENDING = 32  # queued drawing jobs (each holds one image's maps or grids): two batches of 16 may wait


def render_workers() -> int:
    """Threads that encode and write pictures: ``INSPECT_MODEL_RENDER_THREADS``, else 2."""
    from inspect_model.settings import env_int

    return env_int("INSPECT_MODEL_RENDER_THREADS", 2, low=0)


class Drawer:
    """What turns one command's records into files (no files: this base draws nothing).

    ``draw(item, sink)`` draws one item's files and gives their names by kind;
    ``draw_summary(sink, result)`` draws the run's pictures; ``flush(sink)`` finishes what
    a rank drew before its state is gathered (a last contact-sheet page). What a drawer
    accumulates (sheet pages, grid layouts) is part of a run's resumable state:
    ``state_dict()`` / ``load_state_dict()`` / ``merge()``."""

    def reset(self) -> None:
        """Forget what earlier drawing accumulated, before the files are drawn again."""

    def start(self, rank: int) -> None:
        """This process draws rank ``rank``'s share of a run (pages numbered apart)."""

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        return {}

    def draw_summary(self, sink: Sink, result: Any) -> None:
        """Pictures of the whole run (overview, contact sheets, flow plots)."""

    def no_summary(self, result: Any) -> None:
        """The run writes no files: the report's lists of them are empty, not missing."""

    def flush(self, sink: Sink) -> None:
        """Everything this rank drew is queued (before its state is gathered)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (a resumed run)."""

    def merge(self, states: list[dict[str, Any]]) -> None:
        """Every rank's drawing state, in rank order (on rank 0)."""

    def renames(self) -> dict[str, str]:
        """Files to rename after a merge, old name -> new (contact-sheet pages: 1, 2, ...)."""
        return {}
