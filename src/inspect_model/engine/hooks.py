"""The shared hook engine: borrow a model, capture what flows through chosen layers, give it back.

``HookEngine`` is a context manager. On ``__enter__`` it saves the model's state (training
flags, ``requires_grad``, ``.grad`` fields, grad mode, device) and registers forward
pre-hooks and hooks on the selected modules; on ``__exit__`` it removes every hook and
restores every saved value, also when the forward or backward pass raised. Each call of a
selected module gives one :class:`CallRecord` (a module called twice gives two), whose
inputs/outputs are flattened to :class:`TensorCapture` items (``""`` for a lone tensor,
``"0"``, ``"logits"``, ``"aux/1"`` for nested ones).

What is captured is chosen by :class:`CaptureOptions`: statistics computed inside the hook
(streaming, the tensor is dropped), tensors kept (cloned, so a later in-place op cannot
overwrite them), and gradients with respect to outputs and inputs, captured with tensor
hooks; full module backward hooks break on in-place ops (pytorch/pytorch#61519).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from inspect_model.devices import is_placed, model_device
from inspect_model.engine.records import CallRecord, TensorCapture, flatten_tensors
from inspect_model.errors import ModelLoadError, ModelRuntimeError, one_line, out_of_memory

if TYPE_CHECKING:
    import torch
    from torch import nn


__all__ = ["CallRecord", "CaptureOptions", "HookEngine", "TensorCapture", "flatten_tensors", "run_forward"]

StatsFn = Callable[["torch.Tensor"], Any]


@dataclass
class CaptureOptions:
    """What the engine takes at each hooked call (see module docstring)."""

    outputs: bool = True
    inputs: bool = False
    stats_fn: StatsFn | None = None  # computed in the hook on every captured tensor
    keep: bool | Collection[str] = False  # keep tensors: all, or these module names
    output_grads: bool = False  # tensor hooks on outputs: d(target)/d(output)
    input_grads: bool = False  # d(target)/d(input) through this module only
    grad_stats_fn: StatsFn | None = None
    input_grad_stats_fn: StatsFn | None = None  # for input gradients (default: grad_stats_fn)
    keep_grads: bool | Collection[str] = False
    # Modules whose outputs become graph roots: detached, made to require grad, and cloned
    # so the rest of the network runs on them. Everything before them then builds no graph
    # (with frozen parameters), so a backward pass stops there: cheap CAM gradients.
    graph_roots: Collection[str] = ()
    freeze_params: bool = False  # requires_grad False on every parameter for the run
    eval_mode: bool | None = True  # True: model.eval() for the run; False: train(); None: as is
    grad_enabled: bool | None = None  # set grad mode for the run (None: leave it)
    track_stack: bool = False  # keep `stack` of running module names (for MAC attribution)


_PAUSED: list[bool] = []  # non-empty: every engine hook lets the call pass unrecorded


@contextlib.contextmanager
def paused_hooks() -> Iterator[None]:
    """Run the model without any engine recording (a TensorBoard trace on the first batch
    must not count as a batch); hooks stay registered and resume afterwards."""
    _PAUSED.append(True)
    try:
        yield
    finally:
        _PAUSED.pop()


class HookEngine:
    """Context manager that hooks ``layers`` of ``model`` and restores the model on exit.

    >>> with HookEngine(model, ["layer4"], CaptureOptions(keep=True)) as eng:
    ...     model(x)
    >>> eng.records[0].outputs[0].tensor.shape
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str],
        options: CaptureOptions | None = None,
        *,
        device: Any = None,
    ) -> None:
        self.model = model
        self.layers = list(layers)
        self.options = options or CaptureOptions()
        self.device = device
        self.records: list[CallRecord] = []
        self.stack: list[str] = []  # names of hooked modules currently running
        self.failed_in: list[str] = []  # stack at the moment a forward pass raised
        self._handles: list[Any] = []
        self._tensor_handles: list[Any] = []
        self._saved: dict[str, Any] | None = None
        self._patches: list[tuple[Any, str, Any, bool]] = []
        self._calls: dict[str, int] = {}
        self._open: dict[int, CallRecord] = {}
        self.current_module: nn.Module | None = None  # the module whose output stats_fn is given
        self._placed = is_placed(model)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Self:
        import torch

        modules = dict(self.model.named_modules())
        missing = [n for n in self.layers if n not in modules]
        if missing:
            # Internal invariant: names come from select_layers on this very model.
            raise ModelRuntimeError(f"internal: layers not in model: {', '.join(missing[:5])}")
        if self.layers and isinstance(self.model, torch.jit.ScriptModule):
            # torch raises NotImplementedError on hooks of ScriptModules (issue 3).
            raise ModelLoadError(
                "the model is a TorchScript model, and torch does not allow module hooks on it; layer-level "
                "commands need the Python nn.Module (FILE.py:FACTORY) or a torch.export program (.pt2)")
        params = list(self.model.parameters())
        self._saved = {
            "training": [(m, m.training) for m in self.model.modules()],
            "requires_grad": [(p, p.requires_grad) for p in params],
            "grads": [(p, p.grad) for p in params],
            "grad_enabled": torch.is_grad_enabled(),
            "device": self._model_device(),
        }
        try:
            # Park existing .grad tensors: backward would accumulate into them in place.
            for p in params:
                p.grad = None
            if self.device is not None and self._saved["device"] is not None and not is_placed(self.model):
                if torch.device(self.device) != self._saved["device"]:
                    self.model.to(self.device)
            opts = self.options
            if opts.eval_mode is True:
                self.model.eval()
            elif opts.eval_mode is False:
                self.model.train()
            if opts.freeze_params:
                for p in params:
                    p.requires_grad_(False)
            if opts.grad_enabled is not None:
                torch.set_grad_enabled(opts.grad_enabled)
            for name in self.layers:
                mod = modules[name]
                if opts.input_grads and getattr(mod, "inplace", False) is True:
                    # A hook on a view is lost when the view is modified in place, so an
                    # in-place module would hide its input gradient; run it out of place.
                    self.patch(mod, "inplace", False)
                self._register(name, mod)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not self.failed_in:
            self.failed_in = list(self.stack)
        self._restore()
        # Never swallow the error: returning None lets it propagate.

    def close(self) -> None:
        """Restore the model now (idempotent); the same as leaving the ``with`` block."""
        self._restore()

    def _restore(self) -> None:
        import torch

        for h in self._handles + self._tensor_handles:
            h.remove()
        self._handles.clear()
        self._tensor_handles.clear()
        for obj, attr, old, existed in reversed(self._patches):
            if existed:
                setattr(obj, attr, old)
            else:
                delattr(obj, attr)
        self._patches.clear()
        saved, self._saved = self._saved, None
        if saved is None:
            return
        if saved["device"] is not None and self._model_device() != saved["device"] and not is_placed(self.model):
            self.model.to(saved["device"])
        for m, flag in saved["training"]:
            m.training = flag
        for p, flag in saved["requires_grad"]:
            p.requires_grad_(flag)
        for p, g in saved["grads"]:
            p.grad = g
        torch.set_grad_enabled(saved["grad_enabled"])
        self.stack.clear()

    def patch(self, obj: Any, attr: str, value: Any) -> None:
        """Set ``obj.attr = value`` for the duration of the run (restored on exit)."""
        existed = hasattr(obj, attr) and attr in getattr(obj, "__dict__", {attr: None})
        self._patches.append((obj, attr, getattr(obj, attr, None), existed))
        setattr(obj, attr, value)

    def _model_device(self) -> Any:
        return model_device(self.model)

    # ----------------------------------------------------------------- hooks
    def _register(self, name: str, module: nn.Module) -> None:
        def pre_hook(mod: nn.Module, args: tuple, kwargs: dict) -> Any:
            return None if _PAUSED else self._on_pre(name, mod, args, kwargs)

        def post_hook(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            return None if _PAUSED else self._on_post(name, mod, output)

        self._handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        self._handles.append(module.register_forward_hook(post_hook, with_kwargs=True))

    def _wants(self, setting: bool | Collection[str], name: str) -> bool:
        return setting if isinstance(setting, bool) else name in setting

    def _on_pre(self, name: str, mod: nn.Module, args: tuple, kwargs: dict) -> Any:
        opts = self.options
        idx = self._calls.get(name, 0)
        self._calls[name] = idx + 1
        rec = CallRecord(
            name=name,
            module_type=type(mod).__name__,
            call_index=idx,
            order=len(self.records),
            depth=0 if name == "" else name.count(".") + 1,
        )
        self.records.append(rec)
        self.stack.append(name)
        # A module may be re-entered before it returns (recursion); keep a per-depth slot.
        self._open[len(self.stack)] = rec
        if not (opts.inputs or opts.input_grads):
            return None
        flat = flatten_tensors((args, kwargs) if kwargs else args)
        keep = self._wants(opts.keep, name)
        for key, t in flat:
            rec.inputs.append(self._capture(key, t, keep))
        if opts.input_grads:
            return self._alias_inputs(rec, args, kwargs)
        return None

    def _alias_inputs(self, rec: CallRecord, args: tuple, kwargs: dict) -> Any:
        """Give the module views of its inputs and hook those: the gradient they receive
        flows through this module only (a hook on the shared tensor would also collect
        what a residual branch sends back)."""
        import torch

        captures = iter(rec.inputs)

        def alias(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                cap = next(captures)
                if v.requires_grad:
                    # aten.alias, not view_as: its backward hands the gradient on as is, where
                    # view_as's hands on a view of it, which autograd will not add a residual
                    # branch's gradient into in place (resnet50: 16 out-of-place additions).
                    a = torch.ops.aten.alias(v)
                    self._hook_grad(a, cap, rec.name, inputs=True)
                    return a
                return v
            if isinstance(v, tuple) and not hasattr(v, "_fields"):
                return tuple(alias(x) for x in v)
            if isinstance(v, list):
                return [alias(x) for x in v]
            if isinstance(v, dict):
                return {k: alias(x) for k, x in v.items()}
            return v

        if kwargs:
            new_args, new_kwargs = alias((args, kwargs))
            return tuple(new_args), new_kwargs
        return tuple(alias(args)), kwargs

    def _on_post(self, name: str, mod: nn.Module, output: Any) -> Any:
        import torch

        opts = self.options
        rec = self._open.pop(len(self.stack), None)
        if self.stack:
            self.stack.pop()
        if rec is None:  # pragma: no cover - defensive: hooks added mid-forward
            return None
        rec.finished = True
        if not opts.outputs and not opts.output_grads and name not in opts.graph_roots:
            return None
        keep = self._wants(opts.keep, name)
        self.current_module = mod
        replaced = None
        if name in opts.graph_roots and isinstance(output, torch.Tensor) and output.is_floating_point():
            root = output.detach().requires_grad_(True)
            cap = self._capture("", root, keep)
            rec.outputs.append(cap)
            self._hook_grad(root, cap, name)
            # The network continues on a copy so that an in-place op downstream cannot touch
            # the root (in-place on a leaf that requires grad is an error).
            replaced = root.clone()
            return replaced
        for key, t in flatten_tensors(output):
            cap = self._capture(key, t, keep)
            rec.outputs.append(cap)
            if opts.output_grads and t.requires_grad:
                self._hook_grad(t, cap, name)
        return None

    def _capture(self, key: str, t: torch.Tensor, keep: bool) -> TensorCapture:
        opts = self.options
        cap = TensorCapture(
            key=key,
            shape=tuple(t.shape),
            dtype=str(t.dtype).replace("torch.", ""),
            device=str(t.device),
            requires_grad=t.requires_grad,
        )
        if t.device.type == "meta":
            return cap
        if t.is_quantized:  # quint8/qint8: statistics and pictures of the real values it stands for
            t = t.dequantize()
        if opts.stats_fn is not None:
            cap.stats = opts.stats_fn(t)
        if keep:
            # Clone: an in-place op later in the pass (ReLU(inplace=True)) would overwrite it.
            # A model spread over devices (accelerate) has its layers' outputs on several
            # devices: what is kept goes to the CPU as it is recorded (issue 37).
            cap.tensor = t.detach().to("cpu", copy=True) if self._placed else t.detach().clone()
        return cap

    def _hook_grad(self, t: torch.Tensor, cap: TensorCapture, name: str, *, inputs: bool = False) -> None:
        opts = self.options
        keep = self._wants(opts.keep_grads, name)
        stats_fn = (opts.input_grad_stats_fn or opts.grad_stats_fn) if inputs else opts.grad_stats_fn

        def on_grad(g: torch.Tensor) -> None:
            # A tensor hook sees d(target)/d(t) for the value t had when the hook was
            # registered, even if t is modified in place later (autograd docs, "Backward
            # Hooks execution"). Several backward calls accumulate.
            cap.grad_calls += 1
            if keep:
                gd = g.detach().to("cpu", copy=True) if self._placed else g.detach().clone()
                cap.grad = gd if cap.grad is None else cap.grad + gd
            if stats_fn is not None:
                cap.grad_stats = stats_fn(g)

        self._tensor_handles.append(t.register_hook(on_grad))

    # ----------------------------------------------------------------- results
    def finalize(self) -> list[CallRecord]:
        """Fill ``calls_total`` so that reused modules are labelled ``name#i``."""
        totals: dict[str, int] = {}
        for r in self.records:
            totals[r.name] = totals.get(r.name, 0) + 1
        for r in self.records:
            r.calls_total = totals[r.name]
        return self.records

    def by_key(self) -> dict[str, CallRecord]:
        return {r.key: r for r in self.finalize()}

    def reset(self) -> None:
        """Forget the records (hooks stay): for running several passes in one borrow."""
        self.records.clear()
        self._calls.clear()
        self._open.clear()
        self.stack.clear()
        self.failed_in = []
        for h in self._tensor_handles:
            h.remove()
        self._tensor_handles.clear()


def run_forward(engine: HookEngine, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (a forward pass) inside ``engine``; turn a model error into a one-line
    :class:`ModelRuntimeError` that names the innermost layer that failed. A failure in the
    model's first conv/linear layer is an input that does not fit the model: an
    :class:`InputMismatchError` (exit 4) saying what that layer expects."""
    from inspect_model.engine.gc_pause import paused_collection
    from inspect_model.errors import InputMismatchError, InspectModelError

    try:
        with paused_collection():
            return fn()
    except InspectModelError:
        raise
    except Exception as exc:
        engine.failed_in = list(engine.stack)
        # The traceback names the innermost module that raised even where it is not hooked
        # (cam hooks only its target layer); fall back to the hooked stack.
        where = _raising_module(engine.model, exc) or (engine.failed_in[-1] if engine.failed_in else None)
        loc = f" in layer '{where}'" if where else ""
        msg = one_line(str(exc))
        oom = out_of_memory(exc, f" in the forward pass{loc}")
        if oom is not None:  # torch's CPU allocator raises RuntimeError: never "the input does not fit" (issue 28)
            raise ModelRuntimeError(oom) from exc
        text = f"forward pass failed{loc}: {type(exc).__name__}: {msg}"
        from inspect_model.engine.hints import first_layer_hint, size_hint

        sized = size_hint(engine.model, msg)
        if sized is not None:  # a ViT at the wrong image size (issue 39)
            raise InputMismatchError(f"{text}; the input does not fit the model: {sized}") from exc
        hint = first_layer_hint(engine.model) if where else None
        if hint is not None and hint[0] == where:
            raise InputMismatchError(f"{text}; the input does not fit the model: {hint[1]}") from exc
        raise ModelRuntimeError(text) from exc


def _raising_module(model: nn.Module, exc: BaseException) -> str | None:
    """Qualified name of the deepest submodule of ``model`` whose code is on ``exc``'s
    traceback (``None`` for the model itself or none)."""
    names = {id(m): n for n, m in model.named_modules()}
    found = None
    tb = exc.__traceback__
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if obj is not None and names.get(id(obj)):
            found = names[id(obj)]
        tb = tb.tb_next
    return found

