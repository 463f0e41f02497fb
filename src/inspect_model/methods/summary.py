"""The layer table: output shapes, parameters and MACs per module, from one hooked pass.

MACs are counted at the level of tensor operations (a TorchDispatchMode sees every aten
op), so functional code counts: attention's matrix products, ``F.linear``, ``torch.matmul``.
Each op is charged to the innermost module running at the time (its "self" MACs); a row's
MACs are its self MACs, or its whole subtree's when ``depth`` folds it. So the rows always
add up to the total, and so do the parameters (shared or tied tensors counted once, at the
first module that owns them).

By default the pass runs on the ``meta`` device: shapes propagate, nothing is allocated,
no arithmetic runs; models that cannot run on meta fall back to a real forward pass.
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.engine.hooks import CaptureOptions, HookEngine, flatten_tensors
from inspect_model.engine.selection import module_depth
from inspect_model.errors import one_line, out_of_memory
from inspect_model.methods.meta_norms import meta_norm
from inspect_model.methods.rnn_macs import costly_op, is_recurrent, recurrent_macs

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class SummaryRow:
    name: str  # qualified name; "" is the model itself
    type: str
    depth: int
    output_shapes: tuple[tuple[int, ...], ...]  # one per output tensor of the first call
    calls: int  # times called in the pass (0: never called)
    params: int  # own parameters (the whole subtree's when folded by depth)
    params_recursive: int
    trainable: str  # "yes", "no", "partial" or "" (no parameters)
    macs: int  # self MACs (the subtree's when folded)
    macs_recursive: int
    is_leaf: bool
    folded: bool  # depth limit folds its children into it
    status: str = "ok"  # "ok", "not called", "failed"
    tied_to: str | None = None  # for a module whose parameters belong to another row
    unknown_cost_ops: tuple[str, ...] = ()  # ops it ran that the MAC counter has no formula for


@dataclass
class SummaryResult:
    model: str
    input_shapes: list[list[int]]
    dtype: str
    rows: list[SummaryRow]
    total_params: int
    trainable_params: int
    frozen_params: int
    total_macs: int
    param_bytes: int
    buffer_bytes: int
    activation_bytes: int  # sum of leaf outputs' sizes for this batch: a forward estimate
    input_bytes: int
    device: str  # "meta" or the device of the real pass
    notes: list[str] = field(default_factory=list)
    failed_layer: str | None = None
    error: str | None = None
    graph: Any = None  # methods/graph.py's ModelGraph when asked for (summary --graph)


def _sdpa_cpu_macs(args: tuple, out: Any) -> int:
    # (B, H, L, E) x (B, H, S, E) -> scores (B, H, L, S); scores x (B, H, S, Ev) -> out.
    q, k, v = args[0], args[1], args[2]
    b_h = 1
    for d in q.shape[:-2]:
        b_h *= int(d)
    L, E = int(q.shape[-2]), int(q.shape[-1])
    S, Ev = int(k.shape[-2]), int(v.shape[-1])
    return b_h * L * S * E + b_h * L * S * Ev


def _mac_counter(stack: list[str], macs: dict[str, int], analytic: set[str] | None = None,
                 unknown: dict[str, set[str]] | None = None) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    extra: dict[Any, Callable[[tuple, Any], int]] = {}
    for opname in ("_scaled_dot_product_flash_attention_for_cpu",):
        op = getattr(aten, opname, None)
        if op is not None:
            extra[op] = _sdpa_cpu_macs

    class MacCounter(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch's default (True) wraps __torch_dispatch__ in torch._disable_dynamo, which
            # imports torch._dynamo (about a second) on the first op; needed only when a
            # compiled model may run under the counter, i.e. when Dynamo is loaded.
            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = meta_norm(func, args, kwargs)  # a norm on the meta device: no decomposition
            if out is None:
                out = func(*args, **kwargs)
            packet = func._overloadpacket
            where = stack[-1] if stack else ""
            if analytic and where in analytic:
                return out  # a recurrent layer: counted from its sizes (methods/rnn_macs.py)
            n = 0
            if packet in flop_registry:
                # flop_registry counts 2 flops per multiply-add.
                n = int(flop_registry[packet](*args, **kwargs, out_val=out)) // 2
            elif packet in extra:
                n = extra[packet](args, out)
            elif unknown is not None and costly_op(str(packet)):
                unknown[where].add(str(packet).removeprefix("aten."))
            if n:
                macs[stack[-1] if stack else ""] += n
            return out

    return MacCounter()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def _kept_buffers(model: nn.Module, on: bool) -> Iterator[None]:
    """With ``on``, every buffer of ``model`` (batch norm's running mean, variance and
    batch count) is exactly as before when the block ends: a train-mode pass updates them."""
    import torch

    if not on:
        yield
        return
    saved = [(m, k, b, b.detach().clone()) for m in model.modules() for k, b in m._buffers.items()
             if b is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, k, b, copy in saved:
                m._buffers[k] = b  # a module may have replaced the tensor itself
                b.copy_(copy)


def summarize(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    name: str = "model",
    depth: int | None = None,
    forward: Callable[..., Any] | None = None,
    train: bool = False,
) -> SummaryResult:
    """Run one hooked forward pass of ``model(*inputs)`` and build the layer table.

    The model and inputs must already be on the device to use (``meta`` for a free pass).
    If the pass raises, the result holds the rows up to the failing layer and names it in
    ``failed_layer``/``error`` instead of raising.
    """
    modules = _unique_modules(model)
    hooked = _hooked_pass(model, modules, forward or (lambda: model(*inputs)), train)
    owned = _own_parameters(modules)
    totals = _subtree_totals([n for n, _ in modules], owned, hooked.macs)
    rows = _build_rows(modules, depth, hooked, owned, totals)
    sizes = _model_sizes(model)
    in_tensors = flatten_tensors(tuple(inputs))
    first_dtype = str(in_tensors[0][1].dtype).replace("torch.", "") if in_tensors else "float32"
    device = str(in_tensors[0][1].device) if in_tensors else "cpu"
    return SummaryResult(
        model=name,
        input_shapes=[list(t.shape) for _, t in in_tensors],
        dtype=first_dtype,
        rows=rows,
        total_params=sizes.total_params,
        trainable_params=sizes.trainable_params,
        frozen_params=sizes.total_params - sizes.trainable_params,
        total_macs=sum(hooked.macs.values()),
        param_bytes=sizes.param_bytes,
        buffer_bytes=sizes.buffer_bytes,
        activation_bytes=_activation_bytes(hooked.records, modules),
        input_bytes=sum(_nbytes(t) for _, t in in_tensors),
        device=device,
        failed_layer=hooked.failed,
        error=hooked.error,
        notes=_unknown_cost_notes(hooked.unknown, hooked.macs),
    )


def _unique_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module once, in registration order: a module registered twice keeps its first name."""
    seen: set[int] = set()
    modules: list[tuple[str, nn.Module]] = []
    for n, m in model.named_modules(remove_duplicate=False):
        if id(m) not in seen:
            seen.add(id(m))
            modules.append((n, m))
    return modules


@dataclass
class _HookedPass:
    """What the hooked forward pass left: one record per call, self MACs per module name,
    ops with no MAC formula per module name, and where and why the pass failed."""

    records: list[Any]
    macs: dict[str, int]
    unknown: dict[str, set[str]]
    failed: str | None = None
    error: str | None = None
    first_call: dict[str, Any] = field(default_factory=dict)  # name -> record of its first call
    calls: dict[str, int] = field(default_factory=dict)
    finished: dict[str, bool] = field(default_factory=dict)  # every call of the module returned


def _hooked_pass(model: nn.Module, modules: list[tuple[str, nn.Module]], fwd: Callable[[], Any],
                 train: bool) -> _HookedPass:
    """Run ``fwd`` once under the hook engine and the MAC counter; a failure is recorded
    (the innermost running module and a one-line message), not raised."""
    macs: dict[str, int] = defaultdict(int)
    engine = HookEngine(
        model,
        [n for n, _ in modules],
        # train: dropout and batch norm as in training (issue 14); the engine puts every
        # module's flag back, and _kept_buffers the running statistics training mode updates.
        CaptureOptions(outputs=True, eval_mode=not train, grad_enabled=True, track_stack=True),
    )
    error: str | None = None
    failed: str | None = None
    unknown: dict[str, set[str]] = defaultdict(set)
    recurrent = {n: m for n, m in modules if is_recurrent(m)}

    def count_recurrent(name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple, out: Any) -> None:
            macs[name] += recurrent_macs(mod, args)
        return hook

    with engine, _kept_buffers(model, train):
        handles = [m.register_forward_hook(count_recurrent(n)) for n, m in recurrent.items()]
        try:
            # Grad mode stays on: MultiheadAttention's no-grad fast path runs a fused op
            # that hides its matrix products from the MAC counter.
            with _mac_counter(engine.stack, macs, set(recurrent), unknown):
                fwd()
        except Exception as exc:
            stack = [s for s in engine.stack]
            failed = stack[-1] if stack else ""
            msg = one_line(str(exc))
            error = f"{type(exc).__name__}: {msg}"
            error = out_of_memory(exc) or error
        finally:
            for h in handles:
                h.remove()
    hooked = _HookedPass(engine.finalize(), macs, unknown, failed, error, calls=defaultdict(int))
    for r in hooked.records:
        hooked.calls[r.name] += 1
        hooked.first_call.setdefault(r.name, r)
        hooked.finished[r.name] = hooked.finished.get(r.name, True) and r.finished
    return hooked


@dataclass
class _Ownership:
    """Parameters by owner: each tensor once, charged to the first module that owns it."""

    params: dict[str, int]  # name -> own parameter count
    trainable: dict[str, tuple[int, int]]  # name -> (trainable, frozen) own parameter counts
    tied: dict[str, str]  # name -> the module that owns a tensor it shares


def _own_parameters(modules: list[tuple[str, nn.Module]]) -> _Ownership:
    owner: dict[int, str] = {}
    owned = _Ownership({}, {}, {})
    for n, m in modules:
        total = 0
        tr = fr = 0
        for p in m.parameters(recurse=False):
            if id(p) in owner:
                owned.tied.setdefault(n, owner[id(p)])
                continue
            owner[id(p)] = n
            total += p.numel()
            if p.requires_grad:
                tr += p.numel()
            else:
                fr += p.numel()
        owned.params[n] = total
        owned.trainable[n] = (tr, fr)
    return owned


@dataclass
class _SubtreeTotals:
    """Each module's numbers summed over its subtree (itself included)."""

    params: dict[str, int]
    macs: dict[str, int]
    trainable: dict[str, int]
    frozen: dict[str, int]


def _subtree_totals(names: list[str], owned: _Ownership, macs: dict[str, int]) -> _SubtreeTotals:
    """Add each module's own numbers to every ancestor (names are paths)."""
    name_set = set(names)
    totals = _SubtreeTotals(defaultdict(int), defaultdict(int), defaultdict(int), defaultdict(int))
    for n in names:
        for a in _ancestors(n, name_set):
            totals.params[a] += owned.params[n]
            totals.macs[a] += macs.get(n, 0)
            totals.trainable[a] += owned.trainable[n][0]
            totals.frozen[a] += owned.trainable[n][1]
    for key, v in macs.items():  # MACs charged to a module outside the table (defensive)
        if key not in name_set:
            totals.macs[""] += v
    return totals


def _build_rows(modules: list[tuple[str, nn.Module]], depth: int | None, hooked: _HookedPass,
                owned: _Ownership, totals: _SubtreeTotals) -> list[SummaryRow]:
    """One row per module down to ``depth``; after a failure, only the modules reached."""
    rows: list[SummaryRow] = []
    reached_failure = hooked.failed is not None
    for n, m in modules:
        d = module_depth(n)
        if depth is not None and d > depth:
            continue
        if reached_failure and hooked.calls.get(n, 0) == 0:
            continue  # after the failure: not reached
        rows.append(_row(n, m, depth, hooked, owned, totals))
    return rows


def _row(n: str, m: nn.Module, depth: int | None, hooked: _HookedPass, owned: _Ownership,
         totals: _SubtreeTotals) -> SummaryRow:
    """The row of module ``n``: its own numbers, or its subtree's when ``depth`` folds it."""
    d = module_depth(n)
    n_calls = hooked.calls.get(n, 0)
    p_rec, m_rec, tr, fr = totals.params[n], totals.macs[n], totals.trainable[n], totals.frozen[n]
    is_leaf = next(iter(m.children()), None) is None
    folded = depth is not None and d == depth and not is_leaf
    status = "ok"
    if n_calls == 0:
        status = "not called"
    elif not hooked.finished.get(n, True):
        status = "failed"
    shapes: tuple[tuple[int, ...], ...] = ()
    if n in hooked.first_call:
        shapes = tuple(c.shape for c in hooked.first_call[n].outputs)
    own_tr, own_fr = (tr, fr) if folded else owned.trainable[n]
    self_macs = hooked.macs.get(n, 0)
    return SummaryRow(
        name=n,
        type=type(m).__name__,
        depth=d,
        output_shapes=shapes,
        calls=n_calls,
        params=p_rec if folded else owned.params[n],
        params_recursive=p_rec,
        trainable=_trainable_label(own_tr, own_fr),
        macs=m_rec if folded else self_macs,
        macs_recursive=m_rec,
        is_leaf=is_leaf,
        folded=folded,
        status=status,
        tied_to=owned.tied.get(n),
        unknown_cost_ops=tuple(sorted(hooked.unknown.get(n, ()))) if not self_macs else (),
    )


def _trainable_label(trainable: int, frozen: int) -> str:
    """The trainable column: "yes", "no", "partial", or "" for a module with no parameters."""
    if trainable + frozen == 0:
        return ""
    return "yes" if frozen == 0 else ("no" if trainable == 0 else "partial")


@dataclass
class _ModelSizes:
    total_params: int
    trainable_params: int
    param_bytes: int
    buffer_bytes: int


def _model_sizes(model: nn.Module) -> _ModelSizes:
    """Parameter counts and parameter/buffer bytes, each tensor counted once."""
    uniq_params = {id(p): p for p in model.parameters()}
    return _ModelSizes(
        total_params=sum(p.numel() for p in uniq_params.values()),
        trainable_params=sum(p.numel() for p in uniq_params.values() if p.requires_grad),
        param_bytes=sum(_nbytes(p) for p in uniq_params.values()),
        buffer_bytes=sum(_nbytes(b) for b in {id(b): b for b in model.buffers()}.values()),
    )


def _activation_bytes(records: list[Any], modules: list[tuple[str, nn.Module]]) -> int:
    """The sizes of every leaf call's outputs: a forward estimate of activation memory."""
    act = 0
    leaf_names = {n for n, m in modules if next(iter(m.children()), None) is None}
    for r in records:
        if r.name in leaf_names:
            act += sum(_prod(c.shape) * _dtype_size(c.dtype) for c in r.outputs)
    return act


def _unknown_cost_notes(unknown: dict[str, set[str]], macs: dict[str, int]) -> list[str]:
    return [f"MACs unknown for {', '.join(sorted(ops))} in '{n or '(model)'}' (no formula for that op; "
            "counted as 0)" for n, ops in sorted(unknown.items()) if ops and not macs.get(n, 0)]


def _ancestors(name: str, names: set[str]) -> list[str]:
    """``name`` and every enclosing module name present in ``names``, root ('') included."""
    out = [name]
    parts = name.split(".") if name else []
    for i in range(len(parts) - 1, -1, -1):
        a = ".".join(parts[:i])
        if a in names:
            out.append(a)
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


_DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
                "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "quint8": 1, "qint8": 1, "qint32": 4}


def _dtype_size(name: str) -> int:
    return _DTYPE_SIZES.get(name, 4)
