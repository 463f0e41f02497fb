"""The buffers that hold side B's copies of its layer outputs, reused from layer to layer,
batch to batch and call to call.

B keeps a copy of each matched output until A has compared it (methods/compare/exchange.py).
Fresh memory for those copies costs a page fault per 4 KiB page, every batch: the C library
hands freed memory back to the system and takes it again (measured with resnet18 at batch 8,
224 px, 228 MiB of copies: 0.2-0.4x one forward pass more, depending on which thread ran B).
So a copy goes into a buffer A has given back, of the same element count, dtype and device,
when there is one. What is kept between uses is bounded (``cap`` bytes, the compare budget)
and released ``IDLE_S`` seconds after the last compare, by a daemon timer: nothing stays
held once compares stop.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from inspect_model.methods.compare import kernel

IDLE_S = 2.0  # seconds after the last use that the kept buffers are released


class Buffers:
    """Flat buffers by (element count, dtype, device); see the module docstring."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[tuple[int, Any, Any], list[Any]] = {}
        self.kept = 0  # bytes in free
        self.cap = 0
        self.running = 0  # compares under way
        self.last = 0.0  # time.monotonic() when the last one ended
        self.timer: threading.Timer | None = None

    def copy(self, t: Any) -> Any:
        """A copy of ``t`` (its shape, contiguous), in a reused buffer when there is one."""
        import torch

        key = (t.numel(), t.dtype, t.device)
        with self.lock:
            stack = self.free.get(key)
            buf = stack.pop() if stack else None
            if buf is not None:
                self.kept -= buf.numel() * buf.element_size()
        try:
            if buf is None:
                buf = torch.empty(key[0], dtype=t.dtype, device=t.device)
            out = buf.view(t.shape)
            if not kernel.copy(out, t):
                out.copy_(t)
        except (RuntimeError, TypeError):  # a tensor type without a flat buffer (sparse, nested, ...)
            return t.detach().clone()
        return out

    def give_back(self, t: Any) -> None:
        """``t`` (a copy made here, no longer used) kept for the next copy of its size, within ``cap``."""
        if not t.is_contiguous():
            return
        size = t.numel() * t.element_size()
        with self.lock:
            if self.kept + size > self.cap:
                return
            self.free.setdefault((t.numel(), t.dtype, t.device), []).append(t.view(-1))
            self.kept += size

    def start(self, cap: int) -> None:
        """A compare begins: keep at most ``cap`` bytes; nothing is released while it runs."""
        with self.lock:
            self.cap = max(self.cap, cap)
            self.running += 1

    def idle(self) -> None:
        """A compare ended: release everything kept ``IDLE_S`` seconds from now, unless one runs
        then. One timer at a time, re-armed when it fires early (no thread per compare)."""
        with self.lock:
            self.running -= 1
            self.last = time.monotonic()
            if self.timer is None:
                self._arm(IDLE_S)

    def _arm(self, delay: float) -> None:
        self.timer = threading.Timer(delay, self._expire)
        self.timer.daemon = True
        self.timer.name = "inspect-model-compare-buffers"
        self.timer.start()

    def _expire(self) -> None:
        with self.lock:
            left = self.last + IDLE_S - time.monotonic()
            if self.running or left > 0:  # used since: wait the rest
                self._arm(max(left, 0.05))
                return
            self.free.clear()
            self.kept = 0
            self.cap = 0
            self.timer = None

    def release(self) -> None:
        """Everything kept, released now."""
        with self.lock:
            self.free.clear()
            self.kept = 0


BUFFERS = Buffers()


def _after_fork_in_child() -> None:
    """The child has no timer thread and may hold a copy of a locked lock: start empty."""
    BUFFERS.__init__()  # type: ignore[misc]  # in place: importers hold this object


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
