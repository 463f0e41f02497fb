"""Both forwards, each run once per batch, every matched pair compared as it is produced.

Side A runs in the calling thread with a hook on each matched layer; side B runs in a second
thread, and each of its hooks hands its layer output to an :class:`Exchange` and waits there
until A's hook has taken it, so memory holds one layer's pair at a time, not two caches. When
B's calls come in another order than A's (A waits for a layer B has not reached), B goes on
and keeps what A has not taken yet (cloned, so that its own in-place ops cannot change it);
A never waits on B for a layer B will not produce. A side whose hooks must stay traceable
(torch.compile) or that cannot be hooked at all (TorchScript, whose layers come back as extra
outputs of one traced graph) is *cached*: it runs first and keeps its matched outputs, and A
frees each as it compares it. ``Exchange.peak`` says how many B outputs were held at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from inspect_model.methods.compare.stats import PairSums, Scratch

Key = tuple[str, int]  # (A's layer, call index)


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


class Exchange:
    """Where B's layer outputs meet A's (see the module docstring)."""

    def __init__(self, *, lockstep: bool) -> None:
        self.cond = threading.Condition()
        self.lockstep = lockstep
        self.pending: dict[Key, Any] = {}
        self.busy: set[Key] = set()  # taken by A and being compared: B must not go on (its in-place ops)
        self.wanted: Key | None = None
        self.a_done = False
        self.b_done = False
        self.peak = 0
        self.peak_bytes = 0

    def _held(self) -> None:
        self.peak = max(self.peak, len(self.pending))
        size = sum(int(t.numel()) * t.element_size() for t in self.pending.values() if t is not None)
        self.peak_bytes = max(self.peak_bytes, size)

    def put(self, key: Key, tensor: Any) -> None:
        """B's thread: hand over ``tensor``; in lockstep, wait until A took it (or runs elsewhere)."""
        with self.cond:
            if self.a_done:
                return
            self.pending[key] = tensor  # a cached side hands copies of its own, made in its forward
            self._held()
            if self.wanted is not None:  # A waits: wake it (a notify per switch, no more: each costs a GIL hand-over)
                self.cond.notify_all()
            if not self.lockstep:
                return
            self.cond.wait_for(lambda: (key not in self.pending and key not in self.busy) or self.a_done
                               or (self.wanted is not None and self.wanted not in self.pending))
            if key in self.pending and not self.a_done:  # B goes on first: keep a copy of its own
                self.pending[key] = _detached_copy(tensor)

    def take(self, key: Key) -> Any:
        """A's thread: B's output for ``key``, or None when B gave none."""
        with self.cond:
            self.wanted = key
            if key not in self.pending:  # B may hold on to another key: let it run ahead to this one
                self.cond.notify_all()
            self.cond.wait_for(lambda: key in self.pending or self.b_done)
            self.wanted = None
            out = self.pending.pop(key, None)
            if out is not None:
                self.busy.add(key)  # B waits until release(): no wake-up now
            return out

    def release(self, key: Key) -> None:
        """A's thread: done with B's output for ``key``; B may go on."""
        with self.cond:
            self.busy.discard(key)
            self.cond.notify_all()

    def finish(self, side: str) -> None:
        with self.cond:
            if side == "a":
                self.a_done = True
                self.pending.clear()
                self.busy.clear()
            else:
                self.b_done = True
            self.cond.notify_all()


def _detached_copy(t: Any) -> Any:
    return None if t is None else t.detach().clone()


_jobs: queue.SimpleQueue | None = None
_start = threading.Lock()


def in_worker(job: Callable[[], None]) -> threading.Event:
    """Run ``job`` in side B's thread; the event is set when it has returned. The thread lives
    as long as the process (a daemon, idle between runs): a fresh thread's first forward costs
    about as much CPU again as a warm one's (measured with resnet18: 3.0x instead of 2.0x one
    forward for A then B), and the cost target counts both threads."""
    global _jobs
    with _start:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(_jobs,), name="inspect-model-compare-B", daemon=True).start()
    done = threading.Event()

    def run() -> None:
        try:
            job()
        finally:
            done.set()

    _jobs.put(run)
    return done


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
           tolerance: float, low: Any, order: dict[str, int], expected: Callable[[Key], bool]) -> list[Any]:
    """Hooks on A's matched layers: take B's pair and add it to the layer's sums. Returns the
    handles (the caller removes them in ``finally``)."""
    modules = dict(model.named_modules())
    counter = CallCounter()
    handles = []
    mine = threading.get_ident()
    scratch = Scratch()  # one run's buffers, freed with its hooks
    for name in pairs:
        def hook(_mod: Any, _args: Any, out: Any, name: str = name) -> None:
            if threading.get_ident() != mine:  # a module B shares with A, run by B's thread: not A's call
                return
            key = (name, counter.next(name))
            order.setdefault(name, len(order))
            a = first_tensor(out)
            if a is None:
                return
            b = exchange.take(key) if expected(key) else None
            try:
                sums.setdefault(name, PairSums()).add(a, b, tolerance, low, scratch)
            finally:
                exchange.release(key)

        handles.append(modules[name].register_forward_hook(hook))
    return handles


def run_pair(a_model: Any, side: Any, args: tuple[Any, ...], kwargs: dict[str, Any], pairs: dict[str, str],
             sums: dict[str, PairSums], *, tolerance: float, low: Any, order: dict[str, int]) -> tuple[Any, Any, Exchange]:
    """One batch through both sides (see the module docstring): (A's output, B's output, the exchange)."""
    import torch

    exchange = Exchange(lockstep=side.lockstep)
    result: dict[str, Any] = {}

    def run_b() -> None:
        try:
            with torch.no_grad():
                result["out"] = side.run(args, kwargs, exchange.put)
        except BaseException as exc:  # handed to the calling thread, raised there
            result["error"] = exc
        finally:
            exchange.finish("b")

    with torch.no_grad():
        side.prepare(args, kwargs)  # an export or a trace for these shapes: which keys B gives is known now
    handles = hook_a(a_model, pairs, sums, exchange, tolerance=tolerance, low=low, order=order,
                     expected=side.produces)
    b_done = None
    try:
        if side.lockstep:
            b_done = in_worker(run_b)
        else:
            run_b()
            if "error" in result:
                raise result["error"]
        with torch.no_grad():
            out_a = a_model(*args, **kwargs)
    finally:
        exchange.finish("a")
        if b_done is not None:
            b_done.wait()
        for h in handles:
            h.remove()
    if "error" in result:
        raise result["error"]
    return out_a, result.get("out"), exchange
