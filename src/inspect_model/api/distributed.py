"""Runs past one process: sharded under ``torchrun``, resumable with ``--resume``, timed.

Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment) an image
command's sorted input list is cut into one contiguous block of whole batches per rank, so
every image keeps the run index (``images/NNNN-stem``) and batch number it has in a
single-process run. Each rank runs on its own device (``LOCAL_RANK`` picks ``cuda:N``; on
CPU the gloo backend is used) and writes its files into rank 0's staging folder inside the
output directory. At the end each rank's mergeable state (:data:`ADAPTERS`: activation
moments, grads' layer statistics, per-image entries, pass counts, warnings) goes to rank 0 through
``torch.distributed.gather_object`` (grads' summed parameter gradients go by
``torch.distributed.reduce``); rank 0 merges it, draws the run's pictures, writes the
reports and commits the directory. A failure anywhere is spread with ``all_reduce`` so
that every rank exits non-zero and nothing is committed.

With ``--resume`` the staging folder has a fixed name (:data:`RESUME_DIR`) and survives a
failed or killed run. After every batch each rank writes, atomically, its state
(``state-R.pt, read with weights_only=True``) and its manifest (``manifest-R.json``: command, options hash, world size,
finished images). A later run of the same command and options continues after the last
finished batch; other options, or another world size, are refused with a message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import DistributedError, InspectModelError, OutputError, UsageError
from inspect_model.render.files import RESUME_STAGING

if TYPE_CHECKING:
    from inspect_model.api.pipeline import Result, Session

RESUME_DIR = RESUME_STAGING  # OutputDir.MARKER prefix: ignored by the emptiness check, kept by the stale clean-up
MANIFEST_VERSION = 1


# ----------------------------------------------------------------------------- run options
@dataclass(frozen=True)
class Scale:
    """How a run is spread: ``resume`` keeps resumable state; ``workers`` decode images."""

    resume: bool = False
    workers: int = 0


_SCALE: ContextVar[Scale] = ContextVar("inspect_model_scale", default=Scale())  # noqa: B039 - frozen


@contextlib.contextmanager
def scaled(*, resume: bool = False, workers: int = 0) -> Iterator[Scale]:
    """Run the API calls inside with ``--resume`` / ``--workers`` (the CLI's options)."""
    if workers < 0:
        raise UsageError(f"--workers must be 0 or more, got {workers}")
    token = _SCALE.set(Scale(resume, workers))
    try:
        yield _SCALE.get()
    finally:
        _SCALE.reset(token)


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int


def world() -> World | None:
    """The torchrun world from the environment, or None outside torchrun (or for one process)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError as exc:
        raise DistributedError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers: {exc}") from exc
    if size < 1 or not 0 <= rank < size:
        raise DistributedError(f"RANK {rank} does not fit WORLD_SIZE {size}")
    return World(rank, size, local) if size > 1 else None


def rank_device(requested: str) -> str:
    """The device of this rank: ``cuda``/``auto`` become ``cuda:LOCAL_RANK`` under torchrun."""
    w = world()
    if w is None or requested not in ("cuda", "auto"):
        return requested
    import torch

    if not torch.cuda.is_available():
        return "cpu" if requested == "auto" else requested
    return f"cuda:{w.local_rank}"


def is_secondary() -> bool:
    """True on ranks other than 0: they print no report."""
    w = world()
    return w is not None and w.rank != 0


def takes_over(session: Session) -> bool:
    plan = getattr(getattr(session, "prep", None), "plan", None)  # a bare Session has no inputs plan
    if hasattr(plan, "workers"):
        plan.workers = _SCALE.get().workers
    return world() is not None or _SCALE.get().resume


# ----------------------------------------------------------------------------- throughput
class Throughput:
    """Images per second from the start of the run to its end (reported and on stderr)."""

    def __init__(self, session: Session) -> None:
        self.start = time.perf_counter()
        self.images = 0

    def stamp(self, result: Result, images: int | None = None) -> None:
        seconds = time.perf_counter() - self.start
        n = self.images if images is None else images
        result.payload["throughput"] = {"images": n, "seconds": round(seconds, 4),
                                        "images_per_second": round(n / seconds, 3) if seconds > 0 else None}


# ----------------------------------------------------------------------------- session state
def _merge_warnings(target: Any, others: Iterable[Any]) -> None:
    for w in others:
        for text, count in w._counts.items():
            if text in target._counts:
                target._counts[text] += count
            elif len(target._counts) < 200:
                target._counts[text] = count
            else:
                target.dropped += count
        target.dropped += w.dropped


class PerImage:
    """Sessions whose result is one entry per image plus counters (cam, guided-backprop)."""

    FIRST = ("cam_layers", "columns", "cam_layer", "sites", "unguided", "info")  # equal on every rank

    def state(self, s: Any) -> dict[str, Any]:
        keys = ("entries", "passes", "warnings", "sanity_acc", "sheets", "sheet_rows", *self.FIRST)
        st = {k: getattr(s, k) for k in keys if hasattr(s, k)}
        if "sheet_rows" in st:  # thumbnails drawn by the Sink's workers: their images, not futures
            st["sheet_rows"] = [(label, [None if c is None else (c[0].result()[0] if hasattr(c[0], "result")
                                                                 else c[0], c[1]) for c in row])
                                for label, row in st["sheet_rows"]]
        return st

    def restore(self, s: Any, st: dict[str, Any]) -> None:
        for k, v in st.items():
            setattr(s, k, v)

    def start(self, s: Any, index: int, batch: int, rank: int) -> None:
        s.index_base = index
        if hasattr(s, "page_base"):
            s.page_base = rank * 100000  # renumbered on rank 0 (see merge)

    def before_gather(self, s: Any, sink: Any) -> None:
        if hasattr(s, "_flush_sheet"):
            s._flush_sheet(sink, final=True)

    def merge(self, s: Any, states: list[dict[str, Any]]) -> None:
        s.entries = [e for st in states for e in st["entries"]]
        if hasattr(s, "passes"):
            s.passes = {k: sum(st["passes"][k] for st in states) for k in s.passes}
        _merge_warnings(s.warnings, [st["warnings"] for st in states[1:]])
        for k in self.FIRST:
            if hasattr(s, k) and not getattr(s, k):
                setattr(s, k, next((st[k] for st in states if st.get(k)), getattr(s, k)))
        accs = [st["sanity_acc"] for st in states if st.get("sanity_acc")]
        if accs:  # guided-backprop --sanity: per-image correlations, concatenated in rank order
            merged = accs[0]
            for acc in accs[1:]:
                for dst, src in zip(merged["steps"], acc["steps"]):
                    dst["spearman"].extend(src["spearman"])
                    dst["spearman_abs"].extend(src["spearman_abs"])
            s.sanity_acc = merged
        if hasattr(s, "sheets"):
            s.sheets = [p for st in states for p in st["sheets"]]


class Activations:
    """The activations session: mergeable moments per layer and channel (Chan et al.)."""

    def state(self, s: Any) -> dict[str, Any]:
        cap = s.capture
        return {"rows": cap._rows, "images": cap._images, "batches": cap._batches, "entries": s.entries,
                "grids": s.grids, "warnings": s.warnings, "batch_index": s.batch_index, "base": s.index_base}

    def restore(self, s: Any, st: dict[str, Any]) -> None:
        cap = s.capture
        cap._rows, cap._images, cap._batches = st["rows"], st["images"], st["batches"]
        s.entries, s.grids, s.warnings, s.batch_index = st["entries"], st["grids"], st["warnings"], st["batch_index"]

    def start(self, s: Any, index: int, batch: int, rank: int) -> None:
        s.index_base = index
        s.capture._images = index
        s.batch_index = batch

    def before_gather(self, s: Any, sink: Any) -> None:
        pass

    def merge(self, s: Any, states: list[dict[str, Any]]) -> None:
        rows: dict[str, Any] = {}
        for st in states:
            for key, row in st["rows"].items():
                have = rows.get(key)
                if have is None:
                    rows[key] = row
                    continue
                have.moments.merge(row.moments)
                if row.channels is not None:
                    if have.channels is None:
                        have.channels = row.channels
                    else:
                        have.channels.merge(row.channels)
        cap = s.capture
        cap._rows = rows
        cap._images = sum(st["images"] - st["base"] for st in states)
        cap._batches = sum(st["batches"] for st in states)
        s.entries = [e for st in states for e in st["entries"]]
        s.grids = [g for st in states for g in st["grids"]]
        _merge_warnings(s.warnings, [st["warnings"] for st in states[1:]])


class Grads:
    """The grads session: layer statistics merged exactly, parameter gradients summed.

    A single process sums every batch's parameter gradients into ``.grad``; each rank sums
    its own batches the same way, and :meth:`reduce` adds the ranks' sums on rank 0 with
    ``torch.distributed.reduce`` (the global norm, clipping and parameter statistics are
    then those of one process over every image). Layer statistics, histograms and
    per-image records travel with the gather and are merged by
    :func:`inspect_model.methods.gradients.merge_partials`."""

    def state(self, s: Any) -> dict[str, Any]:
        return {"partial": s.snapshot(), "count": s.count, "warnings": s.warnings}

    def restore(self, s: Any, st: dict[str, Any]) -> None:
        s.partial, s.count, s.warnings = st["partial"], st["count"], st["warnings"]

    def start(self, s: Any, index: int, batch: int, rank: int) -> None:
        s.index_base = index  # the labels of --labels-file of this shard start there
        s.count = index

    def before_gather(self, s: Any, sink: Any) -> None:
        pass

    def reduce(self, s: Any, group: Group) -> None:
        """Every rank's summed parameter gradients, added on rank 0 (dropped elsewhere)."""
        if group.dist is None or s.grad_run is None:
            return
        import torch

        dist = group.dist
        part = s.grad_run.partial
        nccl = dist.get_backend() == "nccl"
        device = torch.device(f"cuda:{group.w.local_rank}" if nccl else "cpu")
        trainable = [(n, p) for n, p in s.prep.loaded.model.named_parameters() if p.requires_grad]
        has = torch.tensor([1 if n in part.grads else 0 for n, _ in trainable], dtype=torch.int32, device=device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)  # a rank with no image has no gradient at all
        summed: dict[str, Any] = {}
        for (n, p), flag in zip(trainable, has.tolist()):
            if not flag:
                continue
            g = part.grads.get(n)
            t = (torch.zeros_like(p, device=device) if g is None else g.detach().to(device, copy=True)).contiguous()
            dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
            if group.rank == 0:
                summed[n] = t
        part.grads = summed

    def merge(self, s: Any, states: list[dict[str, Any]]) -> None:
        from inspect_model.methods.gradients import merge_partials

        s.partial = merge_partials([st["partial"] for st in states])
        _merge_warnings(s.warnings, [st["warnings"] for st in states[1:]])


ADAPTERS: dict[str, Any] = {"ActivationsSession": Activations(), "CamSession": PerImage(),
                            "GuidedSession": PerImage(), "GradsSession": Grads(), "AttentionSession": PerImage()}


def adapter(session: Session) -> Any:
    found = ADAPTERS.get(type(session).__name__)
    if found is None:
        what = "--resume" if world() is None else "torchrun"
        if type(session).__name__ == "JacobianSession":
            raise UsageError(f"grads --of/--wrt does not support {what}: its per-batch Jacobian estimates "
                             "(random probes, one figure per batch) are not merged across processes or runs; "
                             "run it in one process, or drop --of/--wrt")
        raise UsageError(f"{session.command} does not support {what} yet; "
                         "activations, grads, cam and guided-backprop do")
    return found


# ----------------------------------------------------------------------------- options hash
def _simple(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_simple(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _simple(x) for k, x in v.items())
    return False


def fingerprint(session: Session) -> str:
    """A hash of the command and every option that shapes its result (not the device)."""
    base = session.prep.options(session.mopts)
    base.pop("device", None)
    own = {k: v for k, v in sorted(vars(session).items()) if _simple(v) and k not in ("index_base", "page_base")}
    text = json.dumps([session.command, base, own], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- sharding
def shard(n: int, batch_size: int, size: int, rank: int) -> tuple[int, int, int]:
    """(first image, end, first batch) of ``rank``: contiguous blocks of whole batches."""
    batches = -(-n // batch_size)
    per = -(-batches // size)
    first = min(rank * per, batches)
    return min(first * batch_size, n), min((first + per) * batch_size, n), first


# ----------------------------------------------------------------------------- collectives
class Group:
    """The process group of a torchrun run (None-like for one process)."""

    def __init__(self, w: World | None) -> None:
        self.w = w
        self.rank = w.rank if w else 0
        self.size = w.size if w else 1
        self.dist: Any = None
        if w is None:
            return
        import torch
        import torch.distributed as dist

        self.dist = dist
        if dist.is_initialized():
            return
        cuda = torch.cuda.is_available() and os.environ.get("INSPECT_MODEL_DIST_BACKEND", "") != "gloo"
        backend = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(w.local_rank)
        from datetime import timedelta

        timeout = timedelta(seconds=float(os.environ.get("INSPECT_MODEL_DIST_TIMEOUT", "1800")))
        try:
            _with_stderr_held(lambda: dist.init_process_group(backend=backend, timeout=timeout))
        except Exception as exc:  # rendezvous: whatever the store raised
            raise DistributedError(f"rank {w.rank}: rendezvous failed ({backend} at "
                                   f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}): "
                                   f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        # Kept for later runs in this process (a second rendezvous on the same store hangs);
        # destroyed at exit.
        import atexit

        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())

    def all_gather(self, obj: Any) -> list[Any]:
        if self.dist is None:
            return [obj]
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        if self.dist is None:
            return [obj]
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        self.dist.gather_object(obj, out, dst=0)
        return out

    def any_failed(self, failed: bool) -> bool:
        """all_reduce(MAX) of a failure flag: True on every rank if any rank failed."""
        if self.dist is None:
            return failed
        import torch

        flag = torch.tensor([1 if failed else 0], dtype=torch.int32,
                            device=f"cuda:{self.w.local_rank}" if self.dist.get_backend() == "nccl" else "cpu")
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
        return bool(flag.item())

    def close(self) -> None:
        if self.dist is not None and self.dist.is_initialized():
            self.dist.barrier()  # no rank leaves while another still reads the shared staging folder


def _one_line(exc: BaseException) -> tuple[int, str]:
    code = getattr(exc, "exit_code", 6) if isinstance(exc, InspectModelError) else 6
    if isinstance(exc, KeyboardInterrupt):
        code = 130
    return code, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class _Phase:
    """Runs a step on every rank; any rank's failure becomes an error on all of them."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def check(self, exc: BaseException | None) -> None:
        if not self.group.any_failed(exc is not None):
            return
        errors = self.group.all_gather(None if exc is None else (self.group.rank, *_one_line(exc)))
        if exc is not None:
            raise exc
        rank, _code, msg = next(e for e in errors if e is not None)
        raise DistributedError(f"rank {rank} failed: {msg}")


# ----------------------------------------------------------------------------- resume files
def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_resume(staging: Path, rank: int, fp: str, command: str, size: int, out_path: Path) -> dict[str, Any] | None:
    manifests = sorted(staging.glob("manifest-*.json"))
    if not manifests:
        return None
    try:
        first = json.loads(manifests[0].read_text())
    except (OSError, ValueError) as exc:
        raise OutputError(f"cannot read the resume manifest '{manifests[0]}': {exc}; "
                          "remove that folder to start over") from exc
    if first.get("command") != command or first.get("options_hash") != fp:
        raise UsageError(f"output directory '{out_path}' holds an unfinished '{first.get('command')}' run with "
                         "other options; repeat its exact command to resume it, or choose another --output-dir")
    if first.get("world_size") != size:
        raise UsageError(f"the unfinished run in '{out_path}' was started with {first.get('world_size')} "
                         f"process(es), this one has {size}; resume it with the same number "
                         "(torchrun --nproc-per-node/--nnodes)")
    state = staging / f"state-{rank}.pt"
    if not state.exists():
        return None
    return _load_state(state)


def _state_classes() -> list[type]:
    """The package's own record classes (dataclasses and the pipeline's Warnings): the only
    globals a resume state's loader accepts (the output directory is no trusted file:
    nothing in it may run code, and building one of our records runs none)."""
    import dataclasses
    import sys

    from PIL import Image

    from inspect_model.api.pipeline import Warnings

    out: list[type] = [Warnings, Image.Image]  # contact-sheet cells: PIL rebuilds pixels, runs nothing
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("inspect_model."):
            continue
        out += [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == name
                and dataclasses.is_dataclass(v)]
    return out


def _save_state(path: Path, state: dict[str, Any]) -> None:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    _atomic_write(path, buf.getvalue())


def _load_state(path: Path) -> dict[str, Any]:
    import torch

    try:
        with torch.serialization.safe_globals(_state_classes()):
            return torch.load(path, map_location="cpu", weights_only=True)  # never full unpickling
    except Exception as exc:  # a damaged or foreign file: say which, never run it
        raise OutputError(f"cannot read the resume state '{path}' ({type(exc).__name__}); "
                          "remove that folder to start over") from exc


class Checkpoint:
    """Writes this rank's state and manifest after each finished batch (``--resume``)."""

    def __init__(self, staging: Path, rank: int, size: int, command: str, fp: str, shard_paths: list[str]) -> None:
        self.staging, self.rank, self.size = staging, rank, size
        self.command, self.fp, self.paths = command, fp, shard_paths
        self.every = float(os.environ.get("INSPECT_MODEL_CHECKPOINT_SECONDS", "0"))
        self.last = 0.0

    def due(self) -> bool:
        """Whether the next :meth:`save` writes (its state is only built then: grads copies gradients)."""
        return not self.every or time.monotonic() - self.last >= self.every

    def save(self, done: int, state: dict[str, Any], *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and self.every and now - self.last < self.every:
            return
        self.last = now
        _save_state(self.staging / f"state-{self.rank}.pt", {**state, "done": done})
        manifest = {"manifest_version": MANIFEST_VERSION, "command": self.command, "options_hash": self.fp,
                    "world_size": self.size, "rank": self.rank, "done": done, "total": len(self.paths),
                    "images": self.paths[:done]}
        _atomic_write(self.staging / f"manifest-{self.rank}.json",
                      (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


# ----------------------------------------------------------------------------- the run
def _open_output(group: Group, output_dir: Any, force: bool, resume: bool) -> tuple[Any, Path | None]:
    """Rank 0 checks and prepares the directory; every rank gets its staging folder."""
    from inspect_model.render.files import OutputDir

    if output_dir is None:
        return None, None
    out = OutputDir(output_dir, force=force)
    exc: BaseException | None = None
    staging: Path | None = None
    if group.rank == 0:
        try:
            fixed = out.path / RESUME_DIR
            had = resume and fixed.is_dir()
            out.prepare()
            if resume:
                assert out.staging is not None
                if had:
                    import shutil

                    shutil.rmtree(out.staging, ignore_errors=True)
                else:
                    os.replace(out.staging, fixed)
                out.staging = fixed
            staging = out.staging
        except BaseException as e:  # noqa: BLE001 - spread to every rank below
            exc = e
    _Phase(group).check(exc)
    staging = Path(group.all_gather(str(staging) if staging else None)[0])
    if group.rank != 0:
        exc = None
        if not (staging.is_dir() and os.access(staging, os.W_OK)):
            exc = OutputError(f"rank {group.rank} cannot write the staging folder '{staging}'; --output-dir must "
                              "be on a file system every node shares")
        out.staging = staging
        _Phase(group).check(exc)
    else:
        _Phase(group).check(None)
    return out, staging


def execute(session: Session, batches: Iterable[Any], *, output_dir: Any = None, force: bool = False,
            keep: bool = False, tensorboard: Any = None, on_item: Callable[[dict[str, Any]], None] | None = None,
            ) -> Result:
    """:func:`inspect_model.api.pipeline.execute` under torchrun and/or with ``--resume``."""
    scale = _SCALE.get()
    if scale.resume and output_dir is None:
        raise UsageError("--resume needs --output-dir DIR (the run's state is kept there)")
    ad = adapter(session)
    group = Group(world())
    old_term = _trap_sigterm()
    try:
        return _run(session, batches, ad, group, scale, output_dir=output_dir, force=force, keep=keep,
                    tensorboard=tensorboard, on_item=on_item)
    finally:
        _restore_sigterm(old_term)
        group.close()


def _with_stderr_held(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` with file descriptor 2 sent to a temporary file: c10d's C++ logging prints
    stack frames there on every failed connection attempt. What it wrote goes back to stderr
    when ``fn`` succeeds; when it raises, the exception alone speaks (one line at the CLI)."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            result = fn()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        text = held.read()
    if text:
        sys.stderr.write(text.decode(errors="replace"))
        sys.stderr.flush()
    return result


def _run(session: Session, batches: Iterable[Any], ad: Any, group: Group, scale: Scale, *, output_dir: Any,
         force: bool, keep: bool, tensorboard: Any, on_item: Any) -> Result:
    from inspect_model.api.pipeline import Result, Sink, write_reports

    plan = session.prep.plan
    all_paths = list(getattr(plan, "paths", []) or [])
    names = [str(p) for p in all_paths]
    # Every rank must see the same sorted input list.
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    seen = group.all_gather((len(names), digest))
    if any(s != seen[0] for s in seen):
        bad = next(i for i, s in enumerate(seen) if s != seen[0])
        raise DistributedError(f"rank {bad} sees {seen[bad][0]} input image(s), rank 0 sees {seen[0][0]} "
                               "(or other files); give every rank the same inputs on a shared file system")
    fp = fingerprint(session)
    first, end, first_batch = shard(len(all_paths), plan.batch_size, group.size, group.rank)
    mine = all_paths[first:end]
    ad.start(session, first, first_batch, group.rank)
    clock = Throughput(session)
    out, staging = _open_output(group, output_dir, force, scale.resume)
    committed = False
    try:
        exc: BaseException | None = None
        try:
            restored = None
            if scale.resume and staging is not None:
                restored = _read_resume(staging, group.rank, fp, session.command, group.size, out.path)
            done = 0
            if restored is not None:
                ad.restore(session, restored["session"])
                out.adopt([(Path(a), Path(b)) for a, b in restored["pending"]], restored["written"])
                plan.skipped[:] = restored["skipped"]
                done = restored["done"]
            if all_paths:
                plan.paths = mine[done:]  # batches() is a generator: it reads the paths when it starts
            if (all_paths and not plan.paths) or (not all_paths and group.rank != 0):
                batches = iter(())  # nothing left for this rank (synthetic input: rank 0 runs it)
            ck = Checkpoint(staging, group.rank, group.size, session.command, fp, [str(p) for p in mine]) \
                if scale.resume and staging is not None else None
            _run_local(session, batches, out, tensorboard, keep, on_item, ck, ad, mine, done, clock)
        except BaseException as e:  # noqa: BLE001 - spread to every rank below
            exc = e
        _Phase(group).check(exc)
        if hasattr(ad, "reduce"):
            ad.reduce(session, group)  # collectives on every rank (grads: summed parameter gradients)
        sink = Sink(out)
        ad.before_gather(session, sink)
        sink.drain()  # the last contact sheet is on disk before rank 0 renumbers the pages
        mine_state = {"session": ad.state(session), "skipped": list(plan.skipped), "notes": list(plan.warnings),
                      "pending": [(str(a), str(b)) for a, b in (out._pending if out else [])],
                      "written": list(out.written) if out else [], "images": clock.images}
        states = group.gather(mine_state)
        result: Any = None
        exc = None
        if group.rank == 0:
            try:
                assert states is not None
                result = _finish_on_rank0(session, ad, states, out, sink, all_paths, clock, keep, write_reports,
                                          tensorboard)
                committed = out is not None
            except BaseException as e:  # noqa: BLE001
                exc = e
        _Phase(group).check(exc)
        # Failed checks (grads --fail-on) make every rank exit 1, not only rank 0.
        failures = group.all_gather(list(result.failures) if group.rank == 0 else None)[0]
        if group.rank != 0:
            return Result(session.command, {}, {}, failures=failures)
        return result
    except BaseException:
        if out is not None and group.rank == 0 and not committed and not scale.resume:
            out.abort()
        raise


def _finish_on_rank0(session: Any, ad: Any, states: list[dict[str, Any]], out: Any, sink: Any,
                     all_paths: list[Path], clock: Throughput, keep: bool, write_reports: Any,
                     tensorboard: Any = None) -> Result:
    plan = session.prep.plan
    if len(states) > 1:
        ad.merge(session, [st["session"] for st in states])
        plan.skipped[:] = [s for st in states for s in st["skipped"]]
        plan.warnings[:] = [w for st in states for w in st["notes"]]
        if out is not None:
            out.adopt([(Path(a), Path(b)) for st in states for a, b in st["pending"]],
                      [w for st in states for w in st["written"]])
            _renumber_sheets(session, out)
    if all_paths:
        plan.paths = all_paths
    result = session.finish()
    result.session = session
    result.items = None
    if tensorboard is not None:  # the run's summary (grads' norms, activation histograms), from rank 0
        from inspect_model.render.tensorboard import open_writer

        sink.writer = open_writer(Path(tensorboard))
    try:
        if sink.active:
            session.draw_summary(sink, result)
        sink.drain()
    finally:
        if sink.writer is not None:
            sink.writer.close()
            sink.writer = None
    clock.stamp(result, sum(st["images"] for st in states))
    if out is not None:
        write_reports(result, sink)
        sink.close()
        out.commit()
    return result


def _renumber_sheets(session: Any, out: Any) -> None:
    """Contact-sheet pages of every rank, numbered 1, 2, ... in rank order."""
    sheets = list(getattr(session, "sheets", []) or [])
    if not sheets:
        return
    renames = {old: f"contact_sheet_{i + 1:03d}.png" for i, old in enumerate(sheets)}
    root = Path(out.path)
    pending = []
    for staged, final in out._pending:
        rel = Path(os.path.relpath(final, root)).as_posix()
        new = renames.get(rel)
        if new is not None:
            target = staged.with_name(f".renamed-{new}")
            os.replace(staged, target)
            staged, final = target, root / new
        pending.append((staged, final))
    out.adopt(pending, [str(root / renames[r]) if (r := Path(os.path.relpath(w, root)).as_posix()) in renames
                        else w for w in out.written])
    session.sheets = [renames[s] for s in sheets]


def _run_local(session: Any, batches: Iterable[Any], out: Any, tensorboard: Any, keep: bool, on_item: Any,
               ck: Checkpoint | None, ad: Any, mine: list[Path], done: int, clock: Throughput) -> None:
    from inspect_model.api.pipeline import Sink, item_handler

    writer = None
    sink: Sink | None = None
    if tensorboard is not None:
        from inspect_model.render.tensorboard import open_writer

        writer = open_writer(Path(tensorboard))
    try:
        sink = Sink(out, writer)
        index = {str(p): i for i, p in enumerate(mine)}
        progress = {"done": done}
        handle = item_handler(session, sink, clock, on_item, None)  # items are never kept here

        def checkpointed(it: Iterable[Any]) -> Iterator[Any]:
            for b in it:
                yield b  # the session feeds it and handles every item before asking for the next
                last = max((index.get(n, -1) for n in b.names), default=-1)
                progress["done"] = max(progress["done"], last + 1)
                if ck is not None and ck.due():
                    sink.drain()  # every file the manifest counts as done is on disk
                    ck.save(progress["done"], _snapshot(session, ad, out))
                if os.environ.get("INSPECT_MODEL_FAIL_AFTER") and \
                        progress["done"] >= int(os.environ["INSPECT_MODEL_FAIL_AFTER"]):
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: a run killed after N images

        session.run(checkpointed(batches), handle)
        sink.drain()  # the workers' files are on disk before the state says so
        if ck is not None:
            progress["done"] = len(mine)
            ck.save(progress["done"], _snapshot(session, ad, out), final=True)
    finally:
        if sink is not None:
            sink.close(cancel=True)  # after drain(): nothing left to drop; on failure, nothing more written
        if writer is not None:
            writer.close()


def _snapshot(session: Any, ad: Any, out: Any) -> dict[str, Any]:
    plan = session.prep.plan
    return {"session": ad.state(session), "skipped": list(plan.skipped),
            "pending": [(str(a), str(b)) for a, b in (out._pending if out else [])],
            "written": list(out.written) if out else []}


def _trap_sigterm() -> Any:
    """torchrun stops the other ranks with SIGTERM when one fails: unwind (clean up) on it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, stop)
    except (ValueError, OSError):
        return None


def _restore_sigterm(old: Any) -> None:
    if old is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, old)
