"""Where a run happens: the :class:`World` (this process's rank among how many), its
:class:`Group` (the collectives between ranks: trivial for one process) and how images are
shared out (:func:`shard`).

Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment) the world has
several ranks: each runs on its own device (``LOCAL_RANK`` picks ``cuda:N``; on CPU the gloo
backend is used). Outside it the world is one process, rank 0 of 1: the runner
(:mod:`inspect_model.run.runner`) treats both alike.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from inspect_model.errors import DistributedError, UsageError, one_line


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


def current_scale() -> Scale:
    return _SCALE.get()


@dataclass(frozen=True)
class World:
    """This process's place in a run: rank ``rank`` of ``size`` (``local_rank``: its device)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0


def world() -> World:
    """The torchrun world from the environment; one process (rank 0 of 1) outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return World()
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError as exc:
        raise UsageError(f"environment variables RANK/WORLD_SIZE/LOCAL_RANK must be whole numbers: "
                         f"{one_line(exc)}") from exc
    if size < 1 or not 0 <= rank < size or local < 0:
        raise UsageError(f"environment variable RANK={rank} does not fit WORLD_SIZE={size} (LOCAL_RANK={local})")
    return World(rank, size, local)


def rank_device(requested: str) -> str:
    """The device of this rank: ``cuda``/``auto`` become ``cuda:LOCAL_RANK`` under torchrun."""
    w = world()
    if w.size == 1 or requested not in ("cuda", "auto"):
        return requested
    import torch

    if not torch.cuda.is_available():
        return "cpu" if requested == "auto" else requested
    return f"cuda:{w.local_rank}"


def is_secondary() -> bool:
    """True on ranks other than 0: they print no report."""
    return world().rank != 0


def shard(n: int, batch_size: int, size: int, rank: int) -> tuple[int, int, int]:
    """(first image, end, first batch) of ``rank``: contiguous blocks of whole batches."""
    batches = -(-n // batch_size)
    per = -(-batches // size)
    first = min(rank * per, batches)
    return min(first * batch_size, n), min((first + per) * batch_size, n), first


class Group:
    """The process group of a run: torch.distributed's under torchrun; for one process every
    collective is the identity (``all_gather(x) == [x]``)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.rank = w.rank
        self.size = w.size
        self.dist: Any = None
        if w.size == 1:
            return
        import torch
        import torch.distributed as dist

        self.dist = dist
        if dist.is_initialized():
            return
        from inspect_model.settings import env_choice, env_float

        cuda = torch.cuda.is_available() and env_choice("INSPECT_MODEL_DIST_BACKEND", ("gloo", "nccl")) != "gloo"
        backend = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(w.local_rank)
        from datetime import timedelta

        timeout = timedelta(seconds=env_float("INSPECT_MODEL_DIST_TIMEOUT", 1800.0, positive=True))
        _import_group_defaults()
        try:
            with_stderr_held(lambda: dist.init_process_group(backend=backend, timeout=timeout))
        except Exception as exc:  # rendezvous: whatever the store raised
            raise DistributedError(f"rank {w.rank}: rendezvous failed ({backend} at "
                                   f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}): "
                                   f"{one_line(exc)}") from exc
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


# torch modules whose functions take ``group=group.WORLD`` as a default argument, evaluated
# when the module is imported. A run imports them late (torchvision -> torch._dynamo ->
# torch._inductor -> torch.distributed.fsdp -> torch.distributed.nn.functional): imported
# after ``init_process_group`` those defaults hold the default group for ever, so
# ``destroy_process_group`` cannot free it; its gloo worker threads then outlive the
# interpreter, and one that drops a tensor while the interpreter finalizes aborts the process
# ("terminate called without an active exception", exit -6; seen on a loaded CI machine).
# Imported first, the defaults are None.
GROUP_DEFAULT_MODULES = ("torch.distributed.nn.functional", "torch.distributed.optim.zero_redundancy_optimizer",
                         "torch.distributed.fsdp.sharded_grad_scaler")


def _import_group_defaults() -> None:
    import importlib

    for name in GROUP_DEFAULT_MODULES:
        with contextlib.suppress(Exception):  # absent or broken in this torch: nothing to pin
            importlib.import_module(name)


class Phase:
    """Runs a step on every rank; any rank's failure becomes an error on all of them."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def check(self, exc: BaseException | None) -> None:
        if not self.group.any_failed(exc is not None):
            return
        errors = self.group.all_gather(None if exc is None else (self.group.rank, one_line(exc)))
        if exc is not None:
            raise exc
        rank, msg = next(e for e in errors if e is not None)
        raise DistributedError(f"rank {rank} failed: {msg}")




def with_stderr_held(fn: Callable[[], Any]) -> Any:
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


