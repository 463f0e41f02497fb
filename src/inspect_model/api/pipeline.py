"""The one pipeline under every command: a request in, a streaming session, a result out.

Every command is a :class:`Session`: it is fed input batches and turns each into per-image
items (the ``--jsonl`` lines, the progress bar and the per-image files all come from
those), then ``finish()`` gives a :class:`Result`. A result knows ``to_dict()`` (exactly
the CLI's ``--json`` document), ``text()``/``rich()`` (the report on stdout) and
``save(dir)`` (exactly the CLI's files, all or nothing). :func:`execute` drives a session
over an input plan, writing files as it goes when an output directory is given, so memory
stays bounded for any number of images.

The output layout is the same for every command (README "Output layout"):
``report.json``, ``report.txt``, pictures of the whole run at the top (``overview.png``,
``contact_sheet_001.png``, ``grad_flow.png``), and one folder per input image,
``images/NNNN-<stem>/``, holding that image's files.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.api.options import (
    InputOptions,
    ModelOptions,
    check_request,
    load,
    resolve_device,
)
from inspect_model.errors import OutputError
from inspect_model.render.files import OutputDir, safe_name
from inspect_model.render.jsonout import envelope
from inspect_model.render.table import clean

if TYPE_CHECKING:
    import torch

    from inspect_model.loading.inputs import InputBatch
    from inspect_model.loading.models import LoadedModel

MAX_WARNINGS = 200  # distinct warnings kept; more are counted, not listed


class Warnings:
    """The one warning policy: identical warnings collapse into one entry with a count,
    in the order first seen; at most :data:`MAX_WARNINGS` distinct ones are kept."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self.dropped = 0

    def add(self, text: str) -> None:
        text = " ".join(str(text).split())
        if text in self._counts:
            self._counts[text] += 1
        elif len(self._counts) < MAX_WARNINGS:
            self._counts[text] = 1
        else:
            self.dropped += 1

    def extend(self, texts: Iterable[str]) -> None:
        for t in texts:
            self.add(t)

    def __len__(self) -> int:
        return len(self._counts)

    def to_list(self) -> list[dict[str, Any]]:
        out = [{"message": m, "count": c} for m, c in self._counts.items()]
        if self.dropped:
            out.append({"message": f"{self.dropped} more warning(s) not listed", "count": self.dropped})
        return out


def input_outcome(plan: Any, warnings: Warnings) -> list[dict[str, str]]:
    """What the inputs gave: each skipped file becomes a warning and the report's
    ``skipped`` list (the same in every command), and the plan's per-image notes warnings."""
    skipped = [{"path": str(p), "reason": r} for p, r in getattr(plan, "skipped", [])]
    for s in skipped:
        warnings.add(f"skipped '{s['path']}': {s['reason']}")
    warnings.extend(getattr(plan, "warnings", []))
    return skipped


def warning_lines(items: list[dict[str, Any]]) -> list[str]:
    """Warnings as the one-line texts stderr shows: ``text (x15)`` for repeats."""
    return [w["message"] + (f" (x{w['count']})" if w["count"] > 1 else "") for w in items]


# ----------------------------------------------------------------------------- preparing
@dataclass
class Prepared:
    """A loaded model, its input plan, and what the run resolved."""

    loaded: LoadedModel
    plan: Any  # loading.inputs.InputPlan or TensorPlan
    categories: list[str] | None
    device: str
    dtype: torch.dtype
    binding: Any = None  # loading.multi_inputs.InputBinding for a model with several inputs

    def options(self, mopts: ModelOptions, **own: Any) -> dict[str, Any]:
        """The one resolved-options record of a report: what was asked, as resolved."""
        base = {
            "model": mopts.spec(),
            "weights": resolved_weights(self.loaded, mopts),
            "checkpoint": str(mopts.checkpoint) if mopts.checkpoint else None,
            "device": self.device,
            "dtype": str(self.dtype).replace("torch.", ""),
            "seed": self.plan.seed,
            "batch_size": self.plan.batch_size,
            "inputs": self.plan.describe(),
        }
        base.update(own)
        return base


def resolved_weights(loaded: Any, mopts: ModelOptions) -> str | None:
    """The weights a report records, the same in every command: torchvision's resolved
    enum name; otherwise the name given (a user model ignores it); null for none."""
    if loaded.source == "torchvision":
        return loaded.weights
    given = mopts.weights if isinstance(mopts.model, str) else None
    return None if given is None or str(given).lower() == "none" else given


def prepare(command: str, mopts: ModelOptions, inputs: InputOptions, *, hooks: bool = True,
            notes: Callable[[str], None] | None = None, default_batch: int | None = None) -> Prepared:
    """Load the model (its notes go to ``notes``) and plan the inputs."""
    import torch

    from inspect_model.loading.inputs import TensorPlan, plan_inputs
    from inspect_model.loading.models import require_hookable
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.methods.targets import check_label_count, load_labels

    check_request(inputs)
    torch_dtype = parse_dtype(mopts.dtype)
    torch.manual_seed(inputs.seed)
    loaded = load(mopts)
    if hooks:
        require_hookable(loaded, command)
    from inspect_model.loading.quantized import refuse_gradients

    refuse_gradients(loaded, command)  # quantized kernels have no autograd
    from inspect_model.api.distributed import rank_device

    dev = _model_device(loaded.model) if loaded.borrowed else resolve_device(rank_device(mopts.device))
    for note in loaded.notes:
        if notes is not None:
            notes(note)
    if torch_dtype != torch.float32 and not loaded.borrowed:
        loaded.model.to(torch_dtype)  # our own freshly loaded copy, never the caller's
    categories = load_labels(inputs.labels) if inputs.labels else loaded.categories
    if inputs.labels and loaded.categories:  # the model names its classes: check at once
        check_label_count(categories, len(loaded.categories))
    from inspect_model.loading.multi_inputs import plan_binding

    binding = plan_binding(loaded.model, inputs.input_size, image_input=inputs.image_input,
                           inputs_file=inputs.inputs_file, dtype=torch_dtype, device=dev, seed=inputs.seed)
    image_size = (inputs.input_size or [None])[0]
    if binding is not None:
        image_size = _spec_text(binding.image_spec) if binding.image_spec is not None else None
        if notes is not None:
            others = ", ".join(str(k) for k in binding.others) or "none"
            wrt = ("; gradients are taken with respect to it, the others held fixed"
                   if command in ("grads", "cam", "guided-backprop", "check") else "")
            notes(f"several inputs: images feed input {binding.image_label} (--image-input); "
                  f"other inputs: {others}{wrt}")
    images = inputs.images
    if isinstance(images, torch.Tensor):
        bs = inputs.batch_size or int(images.shape[0]) or 1
        plan: Any = TensorPlan(images.to(device=dev), names=inputs.names, batch_size=bs, seed=inputs.seed)
    else:
        if isinstance(images, (str, Path)):
            images = [images]
        batch_size = inputs.batch_size or default_batch or (8 if images else 1)
        from inspect_model.api.media import media_binding
        from inspect_model.api.options import parse_floats
        from inspect_model.loading.video import ClipOptions

        plan = plan_inputs(
            loaded, [str(i) for i in images] if images else None,
            input_size=image_size, batch_size=batch_size,
            seed=inputs.seed, preset=inputs.preset, resize=inputs.resize, crop=inputs.crop,
            mean=parse_floats(inputs.mean, "--mean"), std=parse_floats(inputs.std, "--std"),
            skip_bad=inputs.skip_bad, device=dev, dtype=torch_dtype, clip=inputs.clip,
            clip_options=ClipOptions(inputs.frames, inputs.stride, inputs.clips),
        )
        binding, categories = media_binding(command, loaded, plan, binding, categories, notes)
    return Prepared(loaded, plan, categories, dev, torch_dtype, binding)


def _with_graph(batches: Iterable[InputBatch], writer: Any, model: Any,
                notes: Callable[[str], None] | None) -> Iterator[InputBatch]:
    """``batches``, writing the model's graph to TensorBoard on the first (issue 14)."""
    from inspect_model.engine.hooks import paused_hooks
    from inspect_model.render.tensorboard import write_graph

    first = True
    for b in batches:
        if first:
            first = False
            with paused_hooks():  # the trace is no batch: nothing recorded
                note = write_graph(writer, model, b.tensor)
            if note is not None and notes is not None:
                notes(note)
        yield b


def _spec_text(spec: Any) -> str:
    text = "x".join(str(d) for d in spec.shape)
    if spec.dtype:
        text += f":{spec.dtype}" + (f":{spec.low}-{spec.high}" if spec.high is not None else "")
    return text


def _model_device(model: Any) -> str:
    for t in model.parameters():
        return str(t.device)
    for t in model.buffers():
        return str(t.device)
    return "cpu"


# ----------------------------------------------------------------------------- files
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

    def _rel(self, final: str) -> str:
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
        from inspect_model.render.files import png_bytes

        staged, final = self.out.reserve(rel)
        write = self.out.write_staged
        self.defer(lambda: write(staged, final, png_bytes(img() if callable(img) else img, photo=photo)))
        return self._rel(str(final))

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
        return None if self.out is None else self._rel(self.out.save_npy(rel, array))

    def data(self, rel: str, payload: bytes) -> str | None:
        if self.out is None:
            return None
        staged, final = self.out.reserve(rel)
        write = self.out.write_staged
        self.defer(lambda: write(staged, final, payload))
        return self._rel(str(final))

    def text(self, rel: str, payload: str) -> str | None:
        return None if self.out is None else self._rel(self.out.write_text(rel, payload))

    def written(self) -> list[str]:
        return [] if self.out is None else [self._rel(f) for f in self.out.written]


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
    env = os.environ.get("INSPECT_MODEL_RENDER_THREADS")
    if env is not None and env.strip().isdigit():
        return int(env)
    return 2


def image_dir(index: int, name: str) -> str:
    """The folder of one input's files: ``images/0003-cat``."""
    stem = Path(name).stem or name
    return f"images/{index:04d}-{safe_name(stem)}"


def class_tag(cls: int, categories: list[str] | None) -> str:
    """``c281-tabby``: the one way a class names a file."""
    if categories and 0 <= cls < len(categories) and categories[cls]:
        return safe_name(f"c{cls}-{categories[cls]}")
    return f"c{cls}"


@dataclass
class ImageItem:
    """One input's share of a result: its report entry and what draws its files."""

    entry: dict[str, Any]
    data: Any = None  # what the session needs to draw the files (dropped once drawn)


# ----------------------------------------------------------------------------- results
@dataclass
class Result:
    """What a command produced: everything its reports hold (see the module docstring).

    Attributes of the underlying method record (``record``) are reachable directly:
    ``im.summary(...).total_params``, ``im.grads(...).global_norm``."""

    command: str
    options: dict[str, Any]
    payload: dict[str, Any]
    warnings: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # failed checks: exit 1 on the CLI
    record: Any = None
    render_text: Callable[[Result], str] | None = None
    render_rich: Callable[[Result], list[Any]] | None = None
    session: Any = None  # to draw the files again (save)
    items: list[ImageItem] | None = None

    def __getattr__(self, name: str) -> Any:
        record = self.__dict__.get("record")
        if record is not None and not name.startswith("_"):
            return getattr(record, name)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        body = {**self.payload, "warnings": list(self.warnings)}
        return envelope(self.command, body, options=self.options, files=self.files)

    def text(self) -> str:
        assert self.render_text is not None
        return self.render_text(self)

    def rich(self) -> list[Any]:
        return self.render_rich(self) if self.render_rich is not None else [self.text()]

    def save(self, directory: str | os.PathLike[str], *, force: bool = False) -> list[str]:
        """Write the command's files into ``directory``: all of them or, on failure, none."""
        if self.items is None and self.session is not None and getattr(self.session, "streams_files", False):
            raise OutputError("this result was computed without keeping its maps; pass output_dir= to the "
                              "API call (or keep=True) to write its files")
        with OutputDir(directory, force=force) as out:
            sink = Sink(out)
            try:
                if self.session is not None:
                    self.session.reset_drawing()
                    for item in self.items or []:
                        item.entry["files"] = self.session.draw(item, sink)
                    self.session.draw_summary(sink, self)
                sink.drain()
                write_reports(self, sink)
            finally:
                sink.close(cancel=True)
        return list(self.files)


def write_reports(result: Result, sink: Sink) -> None:
    """report.txt, report.json and report.html, after every other file (they list them)."""
    import json

    from inspect_model.render.html import render_html
    from inspect_model.render.jsonout import dumps

    result.files = sorted({*sink.written(), "report.txt", "report.json", "report.html"})
    sink.text("report.txt", clean(result.text()))  # JSON keeps exact strings; text is for terminals
    doc = dumps(result.to_dict())
    sink.text("report.json", doc + "\n")
    sink.text("report.html", render_html(json.loads(doc)))


# ----------------------------------------------------------------------------- sessions
class Session:
    """A command's streaming computation. Subclasses implement ``feed`` and ``finish``, and
    for commands with files ``draw`` (one item's files) and ``draw_summary`` (the run's)."""

    command = ""
    streams_files = False  # per-image files, drawn from data that is dropped once drawn
    index_base = 0  # run index of the first image fed (a shard or a resumed run starts later)

    def feed(self, batch: InputBatch) -> list[ImageItem]:
        raise NotImplementedError

    def run(self, batches: Iterable[InputBatch], handle: Callable[[ImageItem], None]) -> None:
        """Feed every batch, handing each item on as soon as it exists."""
        for batch in batches:
            for item in self.feed(batch):
                handle(item)

    def finish(self) -> Result:
        raise NotImplementedError

    def line(self, item: ImageItem) -> dict[str, Any]:
        """The ``--jsonl`` object of one item."""
        return item.entry

    def reset_drawing(self) -> None:
        """Forget what earlier drawing accumulated (contact-sheet rows) before a re-draw."""

    def draw(self, item: ImageItem, sink: Sink) -> dict[str, Any]:
        return {}

    def draw_summary(self, sink: Sink, result: Result) -> None:
        """Pictures of the whole run (overview, contact sheets, flow plots)."""


def execute(
    session: Session,
    batches: Iterable[InputBatch],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    keep: bool | None = None,
    tensorboard: Any = None,
    on_item: Callable[[dict[str, Any]], None] | None = None,
) -> Result:
    """Feed every batch to ``session``; with ``output_dir``, draw each item's files as it
    comes (bounded memory) and commit the directory when the run succeeds, or leave nothing.
    ``keep`` (default: no output_dir) keeps each item's data so that ``Result.save`` works."""
    from inspect_model.api import distributed

    keep = output_dir is None if keep is None else keep
    prep = getattr(session, "prep", None)
    binding = getattr(prep, "binding", None)
    # A model of several inputs gets its other inputs for the whole run (issue 14).
    with binding.bound(prep.loaded.model) if binding is not None else contextlib.nullcontext():
        if distributed.takes_over(session):  # under torchrun, or --resume
            if hasattr(getattr(prep, "plan", None), "extra_record"):  # shards count paths, not clips or pairs
                from inspect_model.errors import UsageError

                raise UsageError("--resume and torchrun shard image files; video clips and image pairs "
                                 "(video and optical-flow models) run in one process: drop --resume")
            return distributed.execute(session, batches, output_dir=output_dir, force=force, keep=keep,
                                       tensorboard=tensorboard, on_item=on_item)
        return _execute_here(session, batches, output_dir=output_dir, force=force, keep=keep,
                             tensorboard=tensorboard, on_item=on_item)


def _execute_here(session: Session, batches: Iterable[InputBatch], *, output_dir: Any, force: bool, keep: bool,
                  tensorboard: Any, on_item: Callable[[dict[str, Any]], None] | None) -> Result:
    """:func:`execute` in this one process."""
    from inspect_model.api import distributed

    clock = distributed.Throughput(session)
    writer = None
    sink: Sink | None = None
    out = OutputDir(output_dir, force=force).prepare() if output_dir is not None else None
    try:
        if tensorboard is not None:
            from inspect_model.render.tensorboard import open_writer

            writer = open_writer(Path(tensorboard))
        sink = Sink(out, writer)
        items: list[ImageItem] = []
        handle = item_handler(session, sink, clock, on_item, items if keep else None)
        prep = getattr(session, "prep", None)
        if writer is not None and prep is not None:
            batches = _with_graph(batches, writer, prep.loaded.model, getattr(session, "notes", None))
        session.run(batches, handle)
        result = session.finish()
        result.session = session
        result.items = items if keep else None
        if sink.active:
            session.draw_summary(sink, result)
        sink.drain()
        clock.stamp(result)
        if out is not None:
            write_reports(result, sink)
            out.commit()
        return result
    except BaseException:
        if sink is not None:
            sink.close(cancel=True)  # no worker writes into what abort() removes
        if out is not None:
            out.abort()
        raise
    finally:
        if sink is not None:
            sink.close()
        if writer is not None:
            writer.close()


def item_handler(session: Session, sink: Sink, clock: Any, on_item: Callable[[dict[str, Any]], None] | None,
                 items: list[ImageItem] | None) -> Callable[[ImageItem], None]:
    """What happens to each item as the session gives it: counted, drawn (when there are
    files), handed to ``on_item`` (``--jsonl``), then kept in ``items`` or its data dropped."""

    from inspect_model.api.media import flow_file, media_records

    def handle(item: ImageItem) -> None:
        clock.images += 1
        media_records(session, item)
        if sink.active:
            item.entry["files"] = session.draw(item, sink)
            flow_file(session, item, sink, image_dir)
        if on_item is not None:
            on_item(session.line(item))
        if items is not None:
            items.append(item)
        else:
            item.data = None

    return handle


def tracked(batches: Iterator[InputBatch], total: int, progress: Callable[[int, int], None] | None
            ) -> Iterator[InputBatch]:
    """``batches``, calling ``progress(done, total)`` after each."""
    done = 0
    for b in batches:
        yield b
        done += len(b.names)
        if progress is not None:
            progress(done, total)
