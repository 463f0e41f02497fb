"""The one runner under every image command: :func:`run` feeds a session its batches and
delivers a :class:`Result`, in one process (a world of size 1), with ``--resume``, and under
``torchrun`` alike.

Each rank takes one contiguous block of whole batches of the sorted input list (a video or
flow model's clips or pairs: :func:`units`; :func:`inspect_model.run.world.shard`; one
process: all of them), so every image keeps its
run index (``images/NNNN-stem``) and batch number. A rank draws its files into rank 0's
staging folder as its items come (bounded memory); with ``--resume`` it checkpoints its
state after each batch (:mod:`inspect_model.run.resume`). At the end every rank's state
(the session protocol: ``state_dict``) goes to rank 0, which merges it, draws the run's
pictures, writes the reports and commits the directory. A failure anywhere becomes an error
on every rank (:class:`inspect_model.run.world.Phase`) and nothing is committed. The
TensorBoard graph, warnings, checkpoints and signals take the same path in every case.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.run import resume as rs
from inspect_model.run.session import ImageItem, Result, Session
from inspect_model.run.signals import sigterm_unwinds
from inspect_model.run.state_check import check_state
from inspect_model.run.world import Group, Phase, World, shard
from inspect_model.errors import (
    DistributedError,
    Interrupted,
    OutputError,
    Terminated,
    UsageError,
    one_line,
)
from inspect_model.output.sink import Drawer, Sink
from inspect_model.run.reports import write_reports

if TYPE_CHECKING:
    from inspect_model.loading.plans import Plan
    from inspect_model.loading.inputs import InputBatch
    from inspect_model.output.files import OutputDir

_NO_DRAWER = Drawer()
STOPS = (Terminated, Interrupted, KeyboardInterrupt)


class Throughput:
    """Images per second from the start of the run to its end (reported and on stderr)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.images = 0

    def stamp(self, result: Result, images: int | None = None) -> None:
        seconds = time.perf_counter() - self.start
        n = self.images if images is None else images
        result.payload["throughput"] = {"images": n, "seconds": round(seconds, 4),
                                        "images_per_second": round(n / seconds, 3) if seconds > 0 else None}


def run(session: Session, batches: Iterable[InputBatch], world: World | None = None, *,
        output_dir: str | os.PathLike[str] | None = None, force: bool = False, keep: bool = False,
        tensorboard: Any = None, on_item: Callable[[dict[str, Any]], None] | None = None,
        resume: bool = False) -> Result:
    """Feed every batch of this rank's share to ``session`` and give the run's result (on
    ranks other than 0: its failures only). With ``output_dir``, files are drawn as items
    come and the directory is committed when every rank succeeded, or left untouched;
    ``resume`` keeps a state there to go on from. ``keep`` (one process, no ``resume``):
    keep each item's data so that :meth:`Result.save` works."""
    world = world or World()
    if resume and output_dir is None:
        raise UsageError("--resume needs --output-dir DIR (the run's state is kept there)")
    if world.size > 1 or resume:
        session.check_scalable("torchrun" if world.size > 1 else "--resume")
    group = Group(world)
    try:
        with sigterm_unwinds():
            return _Run(session, group, output_dir=output_dir, force=force, keep=keep, tensorboard=tensorboard,
                        on_item=on_item, resume=resume)(batches)
    finally:
        group.close()


class _Run:
    """One run of :func:`run` on this rank."""

    def __init__(self, session: Session, group: Group, *, output_dir: Any, force: bool, keep: bool,
                 tensorboard: Any, on_item: Any, resume: bool) -> None:
        self.session, self.group, self.output_dir, self.force = session, group, output_dir, force
        self.tensorboard, self.on_item, self.resume = tensorboard, on_item, resume
        self.keep = keep and group.size == 1 and not resume
        self.drawer = session.drawer or _NO_DRAWER
        self.plan = getattr(session.prep, "plan", None)
        self.clock = Throughput()
        self.items: list[ImageItem] = []
        self.out: OutputDir | None = None
        self.staging: Path | None = None

    def __call__(self, batches: Iterable[InputBatch]) -> Result:
        session, group, plan = self.session, self.group, self.plan
        paths = units(plan)  # image files; clips or pairs of a video / flow model (loading/samples.py)
        self._same_inputs(paths)
        fp = rs.fingerprint(session.command, session.resolved_options()) if self.resume else ""
        first, end, first_batch = shard(len(paths), getattr(plan, "batch_size", 1) or 1, group.size, group.rank)
        mine = paths[first:end]
        session.start(first, first_batch, group.rank)
        self.out, self.staging = open_output(group, self.output_dir, self.force, self.resume)
        committed = False
        try:
            exc: BaseException | None = None
            sink: Sink | None = None
            try:
                done = self._restore(fp, len(mine))
                if paths:
                    take(plan, mine[done:])  # batches() is a generator: it reads them when it starts
                if (paths and not mine[done:]) or (not paths and group.rank != 0):
                    batches = iter(())  # nothing left for this rank (synthetic input: rank 0 runs it)
                ck = rs.Checkpoint(self.staging, group.rank, group.size, session.command, fp,
                                   [str(p) for p in mine]) if self.resume and self.staging is not None else None
                sink = self._open_sink()
                self._local(batches, sink, ck, mine, done)
            except STOPS:  # a signal: no collectives (torchrun stops the other ranks itself)
                _close(sink, cancel=True)
                raise
            except BaseException as e:  # noqa: BLE001 - spread to every rank below
                exc = e
                _close(sink, cancel=True)
                sink = None
            Phase(group).check(exc)
            assert sink is not None
            try:
                result = self._gather_and_finish(sink, paths)
            finally:
                _close(sink, cancel=True)
            committed = group.rank == 0 and self.out is not None
            # Failed checks (grads --fail-on) make every rank exit 1, not only rank 0.
            failures = group.all_gather(list(result.failures) if group.rank == 0 else None)[0]
            if group.rank != 0:
                return Result(session.command, {}, {}, failures=failures)
            return result
        except BaseException:
            if self.out is not None and group.rank == 0 and not committed:
                if self.resume:
                    self.out.leave()  # the state stays for the next try
                else:
                    self.out.abort()
            raise

    # ------------------------------------------------------------------ steps
    def _same_inputs(self, paths: list[Path]) -> None:
        """Every rank must see the same sorted input list."""
        digest = hashlib.sha256("\n".join(str(p) for p in paths).encode("utf-8", "surrogateescape")).hexdigest()
        seen = self.group.all_gather((len(paths), digest))
        if any(s != seen[0] for s in seen):
            bad = next(i for i, s in enumerate(seen) if s != seen[0])
            raise DistributedError(f"rank {bad} sees {seen[bad][0]} input image(s), rank 0 sees {seen[0][0]} "
                                   "(or other files); give every rank the same inputs on a shared file system")

    def _restore(self, fp: str, shard_len: int) -> int:
        """Go on from this rank's saved state (``--resume``); the number of its images done."""
        if not self.resume or self.staging is None or self.out is None:
            return 0
        st = rs.read_resume(self.staging, self.group.rank, fp, self.session.command, self.group.size,
                            self.out.path, shard_len)
        if st is None:
            return 0
        try:
            check_state(st["session"], self._fresh_state(), "session", command=self.session.command)  # before the session holds any of it
            self.session.load_state_dict(st["session"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise rs.bad_state(st["where"], f"session state: {one_line(exc)}") from exc
        self.out.adopt([(Path(a), Path(b)) for a, b in st["pending"]], st["written"])
        if self.plan is not None:
            self.plan.skipped[:] = [tuple(s) for s in st["skipped"]]
            self.plan.warnings[:] = rs.strings(st.get("notes", []), "the input notes", where=st["where"])
        return int(st["done"])

    def _fresh_state(self) -> Any:
        """This session's state before its first image: what a state read back must look like."""
        try:
            return self.session.state_dict()
        except Exception:  # a session that builds its state only once it has run: no template
            return None

    def _open_sink(self) -> Sink:
        writer = None
        if self.tensorboard is not None:
            from inspect_model.output.tensorboard import open_writer

            writer = open_writer(Path(self.tensorboard))
        return Sink(self.out, writer)

    def _local(self, batches: Iterable[InputBatch], sink: Sink, ck: rs.Checkpoint | None, mine: list[Path],
               done: int) -> None:
        """This rank's batches: fed, each item drawn and handed on, checkpoints after batches."""
        session, prep = self.session, self.session.prep
        if sink.writer is not None and prep is not None and self.group.rank == 0:
            batches = with_graph(batches, sink.writer, prep.loaded.model, session.notes)
        if ck is not None:
            batches = self._checkpointed(batches, sink, ck, mine, done)
        session.run(batches, item_handler(session, self.drawer, sink, self.clock, self.on_item,
                                          self.items if self.keep else None))
        if ck is not None:  # (else the last contact-sheet page is queued behind the last maps, then drained)
            sink.drain()  # the workers' files are on disk before the state says so
            ck.save(len(mine), self.snapshot(), final=True)

    def _checkpointed(self, batches: Iterable[InputBatch], sink: Sink, ck: rs.Checkpoint, mine: list[Path],
                      done: int) -> Iterator[InputBatch]:
        index = {str(p): i for i, p in enumerate(mine)}
        for b in batches:
            yield b  # the session feeds it and handles every item before asking for the next
            done = max(done, max((index.get(n, -1) for n in b.names), default=-1) + 1)
            if ck.due():
                sink.drain()  # every file the manifest counts as done is on disk
                ck.save(done, self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """This rank's state: the session's, the inputs' outcome, the files staged so far."""
        plan = self.plan
        files = self.out.state_dict() if self.out is not None else {"pending": [], "written": []}
        return {"session": self.session.state_dict(),
                "skipped": [(str(p), str(r)) for p, r in getattr(plan, "skipped", [])],
                "notes": [str(w) for w in getattr(plan, "warnings", [])],
                "images": self.clock.images, **files}

    def _gather_and_finish(self, sink: Sink, paths: list[Path]) -> Result:
        group = self.group
        if group.size > 1:
            self.session.reduce(group)  # collectives on every rank (grads: summed parameter gradients)
        self.drawer.flush(sink)
        sink.drain()  # the last contact sheet is on disk before rank 0 renumbers the pages
        states = group.gather(self.snapshot()) if group.size > 1 else None
        result: Any = None
        exc: BaseException | None = None
        if group.rank == 0:
            try:
                result = self._finish(sink, paths, states)
            except BaseException as e:  # noqa: BLE001 - spread to every rank below
                exc = e
        Phase(group).check(exc)
        return result if group.rank == 0 else Result(self.session.command, {}, {})

    def _finish(self, sink: Sink, paths: list[Path], states: list[dict[str, Any]] | None) -> Result:
        """Rank 0: every rank's state merged, the run's pictures and reports, the commit."""
        session, plan, out = self.session, self.plan, self.out
        images = self.clock.images
        if states is not None:
            session.merge([st["session"] for st in states])
            plan.skipped[:] = [s for st in states for s in st["skipped"]]
            plan.warnings[:] = [w for st in states for w in st["notes"]]
            images = sum(st["images"] for st in states)
            if out is not None:
                out.adopt([(Path(a), Path(b)) for st in states for a, b in st["pending"]],
                          [w for st in states for w in st["written"]])
                _rename(out, self.drawer.renames())
        if paths:
            take(plan, None)
        result = session.finish()
        result.session = session
        result.items = self.items if self.keep else None
        if sink.active:
            self.drawer.draw_summary(sink, result)
        else:
            self.drawer.no_summary(result)
        sink.drain()
        self.clock.stamp(result, images)
        if out is not None:
            write_reports(result, sink)
            sink.close()
            out.commit()
        return result


def units(plan: Plan | None) -> list[Any]:
    """What a run shards and counts: the plan's image files, or the clips or frame pairs of a
    video or flow model's plan, by name (:mod:`inspect_model.loading.samples`); none without a plan."""
    return [] if plan is None else plan.units()


def take(plan: Plan | None, chosen: list[Any] | None) -> None:
    """The plan reads only ``chosen`` of its units (None: all of them again)."""
    if plan is not None:
        plan.select(chosen)


def _close(sink: Sink | None, *, cancel: bool) -> None:
    if sink is None:
        return
    try:
        sink.close(cancel=cancel)  # after a drain nothing is dropped; on failure nothing more is written
    finally:
        if sink.writer is not None:
            sink.writer.close()
            sink.writer = None


def _rename(out: OutputDir, renames: dict[str, str]) -> None:
    """Staged files renamed (contact-sheet pages of every rank, numbered 1, 2, ...)."""
    if not renames:
        return
    root = Path(out.path)
    pending = []
    for staged, final in out.pending():
        new = renames.get(Path(os.path.relpath(final, root)).as_posix())
        if new is not None:
            target = staged.with_name(f".renamed-{new}")
            os.replace(staged, target)
            staged, final = target, root / new
        pending.append((staged, final))
    written = [str(root / renames[r]) if (r := Path(os.path.relpath(w, root)).as_posix()) in renames else w
               for w in out.written]
    out.adopt(pending, written)


def open_output(group: Group, output_dir: Any, force: bool, resume: bool) -> tuple[OutputDir | None, Path | None]:
    """Rank 0 checks and prepares the directory; every rank gets its staging folder."""
    from inspect_model.output.files import OutputDir

    if output_dir is None:
        return None, None
    out = OutputDir(output_dir, force=force)
    exc: BaseException | None = None
    staging: Path | None = None
    if group.rank == 0:
        try:
            fixed = out.path / rs.RESUME_DIR
            had = resume and fixed.is_dir() and not fixed.is_symlink()
            out.prepare()
            if resume:
                assert out.staging is not None
                if had:
                    import shutil

                    shutil.rmtree(out.staging, ignore_errors=True)
                else:
                    if fixed.is_symlink() or fixed.exists():
                        raise OutputError(f"'{fixed}' is not a folder this tool made; remove it to start over")
                    os.replace(out.staging, fixed)
                out.staging = fixed
            staging = out.staging
        except BaseException as e:  # noqa: BLE001 - spread to every rank below
            exc = e
    Phase(group).check(exc)
    if group.size == 1:
        return out, staging
    staging = Path(group.all_gather(str(staging) if staging else None)[0])
    exc = None
    if group.rank != 0:
        if not (staging.is_dir() and os.access(staging, os.W_OK)):
            exc = OutputError(f"rank {group.rank} cannot write the staging folder '{staging}'; --output-dir must "
                              "be on a file system every node shares")
        out.staging = staging
    Phase(group).check(exc)
    return out, staging


def item_handler(session: Session, drawer: Drawer, sink: Sink, clock: Throughput,
                 on_item: Callable[[dict[str, Any]], None] | None,
                 items: list[ImageItem] | None) -> Callable[[ImageItem], None]:
    """What happens to each item as the session gives it: counted, drawn (when there are
    files), handed to ``on_item`` (``--jsonl``), then kept in ``items`` or its data dropped.
    Clips and pairs get their records, and a flow model's pairs their flow picture
    (:mod:`inspect_model.run.media`)."""
    from inspect_model.run.media import flow_file, media_records
    from inspect_model.output.files import image_dir

    def handle(item: ImageItem) -> None:
        clock.images += 1
        media_records(session, item)
        if sink.active:
            item.entry["files"] = drawer.draw(item, sink)
            flow_file(session, item, sink, image_dir)
        if on_item is not None:
            on_item(session.line(item))
        if items is not None:
            items.append(item)
        else:
            item.data = None

    return handle


def with_graph(batches: Iterable[InputBatch], writer: Any, model: Any,
               notes: Callable[[str], None] | None) -> Iterator[InputBatch]:
    """``batches``, writing the model's graph to TensorBoard on the first (issue 14)."""
    from inspect_model.engine.hooks import paused_hooks
    from inspect_model.output.tensorboard import write_graph

    first = True
    for b in batches:
        if first:
            first = False
            with paused_hooks():  # the trace is no batch: nothing recorded
                note = write_graph(writer, model, b.tensor)
            if note is not None and notes is not None:
                notes(note)
        yield b
