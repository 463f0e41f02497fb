"""Both forwards, each run once per batch, every matched pair compared as A produces it.

Side B runs first and keeps a copy of each matched layer output (a copy: its own later
in-place ops, e.g. ``ReLU(inplace=True)`` after a batch norm or ``out += x``, would change the
tensor itself) until A's hook on that layer takes and compares it. B runs ahead only within a
byte budget (:func:`default_budget`: 256 MiB, or a quarter of the memory available if less).
A small model's B runs its whole forward in the calling thread, then A runs its forward there
too: no second thread, no hand-over per layer, no two forwards competing for the cores and
caches (measured: the two threads at once cost A's convolutions ~1.7x their time alone). When
B's next output would take the held copies over the budget, A starts in a worker thread and
takes them as its forward reaches each layer; B waits until A has taken enough (down to half
the budget) and goes on, so a large model holds at most the budget (one output more only
when that output alone is larger). When B's calls come in another order than A's (A waits
for a layer B has not reached), B goes on past the budget; A never waits on B for a layer B
will not produce; when A fails, B stops at its next layer. A side whose hooks must stay
traceable (torch.compile) or that cannot be hooked at all (TorchScript, whose layers come back
as extra outputs of one traced graph) is *cached*: it hands all its matched outputs at once
after its forward (no budget). ``Exchange.peak``/``peak_bytes`` say how much of B was held.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from inspect_model.methods.compare.buffers import BUFFERS
from inspect_model.methods.compare.stats import PairSums, Scratch

Key = tuple[str, int]  # (A's layer, call index)
BUDGET = 256 * 2**20  # bytes of B's layer outputs held at once, at most (see default_budget)


def default_budget() -> int:
    """:data:`BUDGET`, or a quarter of the memory available now if that is less (Linux's
    ``MemAvailable``; elsewhere the constant)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(1, min(BUDGET, int(line.split()[1]) * 1024 // 4))
    except (OSError, ValueError, IndexError):
        pass
    return BUDGET


def first_tensor(out: Any) -> Any:
    """The layer output compared: the output itself, or the first floating tensor in it."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    from inspect_model.engine.records import flatten_tensors

    for _, t in flatten_tensors(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t
    return None


def _nbytes(t: Any) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class Stopped(Exception):
    """Raised in B's forward when A has failed: B stops at its next layer (A's error is raised)."""


class Exchange:
    """Where B's layer outputs meet A's (see the module docstring). ``budget``: bytes B may
    hold ahead of A (None: no limit, for a cached side); ``on_full``: called in B's thread when
    the budget is reached, before B waits (starts A's forward in another thread)."""

    def __init__(self, *, budget: int | None, on_full: Callable[[], None] | None = None) -> None:
        self.cond = threading.Condition()
        self.budget = budget
        self.pooled = budget is not None  # B's copies are made in BUFFERS (a cached side hands its own)
        self.solo = on_full is not None  # until on_full starts A in another thread, B's thread is the only one
        self.on_full = on_full
        self.pending: dict[Key, Any] = {}
        self.held = 0  # bytes in pending
        self.wanted: Key | None = None  # the key A waits for
        self.blocked = 0  # while B waits for room: the size of the output it holds (> 0)
        self.a_done = False
        self.a_failed = False
        self.b_done = False
        self.peak = 0
        self.peak_bytes = 0

    def _room(self) -> bool:
        """Whether B (blocked with an output of ``self.blocked`` bytes) may go on."""
        if self.a_done or not self.held or (self.wanted is not None and self.wanted not in self.pending):
            return True  # A is done, holds nothing of B, or waits for a key B has not reached
        return self.held + self.blocked <= self.budget and 2 * self.held <= self.budget  # type: ignore[operator]

    def put(self, key: Key, tensor: Any, *, copy: bool = True) -> None:
        """B's thread: hand over ``tensor`` (``copy``: keep a copy of it, not the tensor B's
        forward goes on with); wait first while it would take the held outputs over the budget."""
        if self.a_done:
            if self.a_failed:
                raise Stopped
            return
        if copy and tensor is not None:
            tensor = BUFFERS.copy(tensor)
        size = _nbytes(tensor)
        if self.solo and (self.budget is None or not self.held or self.held + size <= self.budget):
            self._keep(key, tensor, size)  # A has not started: no other thread reads these, no lock
            return
        if self.budget is not None and self.held and self.held + size > self.budget:
            if self.on_full is not None:
                self.solo = False
                self.on_full()  # A starts (or goes on): B is as far ahead as the budget lets it be
            with self.cond:
                self.blocked = max(size, 1)
                self.cond.wait_for(self._room)
                self.blocked = 0
                if self.a_failed:
                    raise Stopped
        with self.cond:
            if self.a_done:
                return
            self._keep(key, tensor, size)
            if self.wanted is not None:  # A waits: wake it (a notify per switch, no more: each costs a GIL hand-over)
                self.cond.notify_all()

    def _keep(self, key: Key, tensor: Any, size: int) -> None:
        self.pending[key] = tensor
        self.held += size
        if self.held > self.peak_bytes:
            self.peak_bytes = self.held
        if len(self.pending) > self.peak:
            self.peak = len(self.pending)

    def take(self, key: Key) -> Any:
        """A's thread: B's output for ``key`` (A's to free), or None when B gave none."""
        if self.b_done:  # B has finished and writes nothing more: no lock, no wait
            out = self.pending.pop(key, None)
            self.held -= _nbytes(out)
            return out
        with self.cond:
            if key not in self.pending and not self.b_done:
                self.wanted = key
                self.cond.notify_all()  # B may wait for room: let it run ahead to this key
                self.cond.wait_for(lambda: key in self.pending or self.b_done)
                self.wanted = None
            out = self.pending.pop(key, None)
            self.held -= _nbytes(out)
            if self.blocked and self._room():
                self.cond.notify_all()
            return out

    def finish(self, side: str, *, failed: bool = False) -> None:
        with self.cond:
            if side == "a":
                self.a_done = True
                self.a_failed = failed
                self.pending.clear()
                self.held = 0
            else:
                self.b_done = True
            self.cond.notify_all()


_jobs: queue.SimpleQueue = queue.SimpleQueue()
_worker: threading.Thread | None = None
_start = threading.Lock()


def in_worker(job: Callable[[], None]) -> threading.Event:
    """Run ``job`` in side B's thread; the event is set when it has returned. The thread lives
    as long as the process (a daemon, idle between runs): a fresh thread's first forward costs
    about as much CPU again as a warm one's (measured with resnet18: 3.0x instead of 2.0x one
    forward for A then B), and the cost target counts both threads."""
    global _jobs, _worker
    with _start:
        if _worker is None or not _worker.is_alive():  # the first run (or the worker ended)
            _jobs = queue.SimpleQueue()
            _worker = threading.Thread(target=_serve, args=(_jobs,), name="inspect-model-compare-B", daemon=True)
            _worker.start()
    done = threading.Event()

    def run() -> None:
        try:
            job()
        finally:
            done.set()

    _jobs.put(run)
    return done


def _after_fork_in_child() -> None:
    """A forked child has no worker thread (only the forking thread survives a fork) and may
    have copied ``_start`` or the queue's lock while another thread held it: start afresh, so
    that a compare in the child makes its own worker (see README: fork after compare)."""
    global _jobs, _worker, _start
    _jobs, _worker, _start = queue.SimpleQueue(), None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        try:
            job()
        except BaseException:  # noqa: BLE001  run_b hands its errors to the calling thread; no job ends this thread
            pass


class CallCounter:
    """Call indices per layer (a module called twice in one forward gives two pairs)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def next(self, name: str) -> int:
        i = self.calls.get(name, 0)
        self.calls[name] = i + 1
        return i


def hook_a(model: Any, pairs: dict[str, str], sums: dict[str, PairSums], exchange: Exchange, *,
           tolerance: float, low: Any, order: dict[str, int], expected: Callable[[Key], bool],
           a_thread: list[int | None]) -> list[Any]:
    """Hooks on A's matched layers: take B's pair and add it to the layer's sums; they count
    only calls in A's thread (``a_thread[0]``, set when A's forward starts). Returns the
    handles (the caller removes them in ``finally``)."""
    modules = dict(model.named_modules())
    calls: dict[str, int] = {}  # call indices per layer, as CallCounter (inline: this runs once per pair)
    handles = []
    scratch = Scratch()  # one run's buffers, freed with its hooks
    for name in pairs:
        def hook(_mod: Any, _args: Any, out: Any, name: str = name) -> None:
            if threading.get_ident() != a_thread[0]:  # a module B shares with A, run by B's forward: not A's call
                return
            i = calls.get(name, 0)
            calls[name] = i + 1
            if name not in order:
                order[name] = len(order)
            a = first_tensor(out)
            if a is None:
                return
            key = (name, i)
            b = exchange.take(key) if expected(key) else None
            s = sums.get(name)
            if s is None:
                s = sums[name] = PairSums()
            s.add(a, b, tolerance, low, scratch)
            if b is not None and exchange.pooled:
                BUFFERS.give_back(b)  # compared: the next copy of its size goes there

        handles.append(modules[name].register_forward_hook(hook))
    return handles


def run_pair(a_model: Any, side: Any, args: tuple[Any, ...], kwargs: dict[str, Any], pairs: dict[str, str],
             sums: dict[str, PairSums], *, tolerance: float, low: Any, order: dict[str, int],
             budget: int | None = None) -> tuple[Any, Any, Exchange]:
    """One batch through both sides (see the module docstring): (A's output, B's output, the
    exchange). ``budget``: bytes B may hold ahead of A (None: :func:`default_budget`)."""
    import torch

    result: dict[str, Any] = {}
    a_thread: list[int | None] = [None]
    a_job: list[threading.Event] = []

    def run_a() -> None:
        a_thread[0] = threading.get_ident()
        failed = True
        try:
            with torch.no_grad():
                result["a"] = a_model(*args, **kwargs)
            failed = False
        except BaseException as exc:  # handed to the calling thread, raised there
            result["a_error"] = exc
        finally:
            exchange.finish("a", failed=failed)

    def start_a() -> None:  # B's (the calling) thread, at the budget: A's forward goes on in the worker
        if not a_job:
            a_job.append(in_worker(run_a))

    exchange = Exchange(budget=(budget or default_budget()) if side.streamed else None, on_full=start_a)

    def emit(key: Key, tensor: Any) -> None:
        exchange.put(key, tensor, copy=side.streamed)  # a cached side hands copies of its own

    handles = hook_a(a_model, pairs, sums, exchange, tolerance=tolerance, low=low, order=order,
                     expected=side.produces, a_thread=a_thread)
    out_b = None
    try:
        with torch.no_grad():
            side.prepare(args, kwargs)  # an export or a trace for these shapes: which keys B gives is known now
            try:
                out_b = side.run(args, kwargs, emit)
            except Stopped:  # A failed: its error is raised below
                pass
            finally:
                exchange.finish("b")
        if not a_job:  # B fitted in the budget: A runs here, after it
            run_a()
    finally:
        exchange.finish("b")
        if a_job:
            a_job[0].wait()
        for h in handles:
            h.remove()
        exchange.on_full = None  # start_a -> run_a -> exchange: no cycle left for the collector
    if "a_error" in result:
        raise result["a_error"]
    return result["a"], out_b, exchange
