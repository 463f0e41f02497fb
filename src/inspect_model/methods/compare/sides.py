"""Side B of a comparison: how it is called and how its layer outputs come out.

Each side has ``run(args, kwargs, emit) -> output`` (one forward; ``emit((A's layer, call),
tensor)`` for each matched layer call), ``produces(key)`` (whether A should wait for that
key), ``streamed`` (True: its outputs come during its forward, which may wait for room in
the budget; False: *cached*, all at once after it; see :mod:`.exchange`) and ``close()``.

- :class:`EagerSide`: an ``nn.Module`` (another model, a cast or moved copy, dynamic
  quantization, train mode), hooked like A; streamed.
- :class:`ExportSide`: a ``torch.export`` program made in memory, run node by node by a
  ``torch.fx.Interpreter``; a module call's output is the last node whose ``nn_module_stack``
  holds that call (``layer1.0.relu@1`` is the second call of ``layer1.0.relu``); streamed.
- :class:`CompiledSide`: ``torch.compile`` of a copy, with hooks that only append to a list
  (Dynamo traces them, so the outputs are those of the compiled graphs); cached.
- :class:`TracedSide`: ``torch.jit.trace`` of a wrapper that returns every matched layer's
  output beside the model's (a traced graph's submodules cannot be hooked or called); cached.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from inspect_model.methods.compare.exchange import CallCounter, Key, first_tensor

Emit = Callable[[Key, Any], None]


def moved(tree: Any, device: Any, dtype: Any) -> Any:
    """``tree``'s tensors on ``device``, floating ones in ``dtype`` (None: as they are)."""
    if device is None and dtype is None:  # nothing to move (and no pytree pass: its closures are cyclic garbage)
        return tree
    import torch
    import torch.utils._pytree as pytree

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if dtype is not None and t.is_floating_point():
            return t.to(device=device or t.device, dtype=dtype)
        return t.to(device) if device is not None else t

    return pytree.tree_map(one, tree)


class _NotTorch(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "torch" or record.name.startswith("torch."))


@contextlib.contextmanager
def torch_logs_dropped() -> Iterator[None]:
    """torch's log records kept off every handler (torch's, the root's, logging's last resort)
    while this runs: the CLI prints its own output only. Other loggers' records pass."""
    drop = _NotTorch()
    loggers = [lg for name, lg in list(logging.Logger.manager.loggerDict.items())
               if isinstance(lg, logging.Logger) and (name == "torch" or name.startswith("torch."))]
    handlers = {h for lg in [*loggers, logging.getLogger()] for h in lg.handlers}
    if logging.lastResort is not None:
        handlers.add(logging.lastResort)
    for h in handlers:
        h.addFilter(drop)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(drop)


class EagerSide:
    streamed = True

    def __init__(self, model: Any, names: dict[str, str], *, device: Any = None, dtype: Any = None) -> None:
        self.model, self.names, self.device, self.dtype = model, names, device, dtype  # names: B's -> A's

    def produces(self, key: Key) -> bool:
        return True

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Made for these inputs' shapes (an export, a trace), before the threads start."""

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], emit: Emit) -> Any:
        modules = dict(self.model.named_modules())
        counter = CallCounter()
        handles = []
        try:
            for b_name, a_name in self.names.items():
                def hook(_m: Any, _a: Any, out: Any, a_name: str = a_name) -> None:
                    emit((a_name, counter.next(a_name)), first_tensor(out))

                handles.append(modules[b_name].register_forward_hook(hook))
            args, kwargs = moved((args, kwargs), self.device, self.dtype)
            return self.model(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()

    def close(self) -> None:
        """Nothing stays registered between runs."""


class CompiledSide(EagerSide):
    streamed = False

    def __init__(self, model: Any, names: dict[str, str]) -> None:
        import torch

        super().__init__(model, names)
        self.store: list[tuple[str, Any]] = []
        modules = dict(model.named_modules())
        store = self.store
        self.handles = []
        for b_name, a_name in names.items():
            def hook(_m: Any, _a: Any, out: Any, a_name: str = a_name) -> None:
                t = first_tensor(out)
                if t is not None:
                    store.append((a_name, t.detach().clone()))  # a copy: later in-place ops leave it

            self.handles.append(modules[b_name].register_forward_hook(hook))
        self.compiled = torch.compile(model)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], emit: Emit) -> Any:
        import torch._inductor.config as inductor

        self.store.clear()
        # The compile happens in this first call. One compile thread: inductor's pool of compile
        # threads would outlive the command (non-daemon, so the CLI warned that the model left
        # threads running); torch's own log lines ("No CUDA runtime is found") are not ours to print.
        with inductor.patch(compile_threads=1), torch_logs_dropped():
            out = self.compiled(*args, **kwargs)
        counter = CallCounter()
        for a_name, t in self.store:
            emit((a_name, counter.next(a_name)), t)
        self.store.clear()
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


class ExportSide:
    streamed = True

    def __init__(self, model: Any, names: dict[str, str]) -> None:
        self.model, self.names = model, names
        self.shapes: Any = None
        self.gm: Any = None
        self.watch: dict[Any, list[Key]] = {}
        self.keys: set[Key] = set()

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch
        import torch.utils._pytree as pytree

        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves((args, kwargs))]
        if shapes == self.shapes:
            return
        ep = torch.export.export(self.model, args, kwargs)  # in memory: no archive is ever loaded
        self.gm, self.shapes = ep.module(), shapes
        last: dict[str, Any] = {}
        for node in self.gm.graph.nodes:
            for key in (node.meta.get("nn_module_stack") or {}):
                last[key] = node
        self.watch, self.keys = {}, set()
        for key, node in last.items():
            path = str(node.meta["nn_module_stack"][key][0])
            call = key.rpartition("@")[2] if "@" in key else "0"
            if path in self.names and call.isdigit():
                k = (self.names[path], int(call))
                self.watch.setdefault(node, []).append(k)
                self.keys.add(k)

    def produces(self, key: Key) -> bool:
        return key in self.keys

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], emit: Emit) -> Any:
        import torch
        import torch.utils._pytree as pytree

        watch = self.watch

        class Tap(torch.fx.Interpreter):
            def run_node(self, n: Any) -> Any:
                out = super().run_node(n)
                for k in watch.get(n, ()):
                    emit(k, first_tensor(out))
                return out

        flat = pytree.tree_leaves((args, kwargs))
        out = Tap(self.gm).run(*flat)
        spec = getattr(self.gm, "_out_spec", None)
        return pytree.tree_unflatten(list(out), spec) if spec is not None and isinstance(out, (list, tuple)) else out

    def close(self) -> None:
        self.gm = None


class _Tapped:
    """A wrapper module whose forward returns (the model's output, [each matched layer output])."""

    @staticmethod
    def make(model: Any, names: dict[str, str]) -> Any:
        import torch

        class Tapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model
                self.order: list[str] = []

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                taps: list[Any] = []
                self.order.clear()
                modules = dict(self.inner.named_modules())
                handles = []
                for b_name, a_name in names.items():
                    def hook(_m: Any, _a: Any, out: Any, a_name: str = a_name) -> None:
                        t = first_tensor(out)
                        if t is not None:
                            taps.append(t.clone())
                            self.order.append(a_name)

                    handles.append(modules[b_name].register_forward_hook(hook))
                try:
                    return self.inner(*args, **kwargs), taps
                finally:
                    for h in handles:
                        h.remove()

        return Tapped()


class TracedSide:
    streamed = False

    def __init__(self, model: Any, names: dict[str, str]) -> None:
        self.wrapper = _Tapped.make(model, names)
        self.traced: Any = None
        self.shapes: Any = None
        self.order: list[str] = []

    def produces(self, key: Key) -> bool:
        return True

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import warnings

        import torch
        import torch.utils._pytree as pytree

        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves((args, kwargs))]
        if shapes != self.shapes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.jit.trace is deprecated; its tracer warnings are ours to say
                self.traced = torch.jit.trace(self.wrapper, args, example_kwarg_inputs=kwargs or None, strict=False,
                                              check_trace=False)
            self.shapes, self.order = shapes, list(self.wrapper.order)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], emit: Emit) -> Any:
        out, taps = self.traced(*args, **kwargs)
        counter = CallCounter()
        for a_name, t in zip(self.order, taps):
            emit((a_name, counter.next(a_name)), t)
        return out

    def close(self) -> None:
        self.traced = None
