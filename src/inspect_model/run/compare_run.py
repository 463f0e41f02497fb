"""``compare``'s run: both sides loaded or made, layers matched, the passes run, the report
assembled (the maths is in methods/compare/).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from inspect_model.errors import InspectModelError, ModelRuntimeError, one_line
from inspect_model.run.options import InputOptions, ModelOptions, load
from inspect_model.run.session import Result


def _side_b_model(mopts: ModelOptions, request: Any, device: str, dtype: Any, seed: int,
                  a_model: Any = None) -> tuple[Any, str]:
    """B as a second model or checkpoint, loaded as A was (device, dtype): (model, its name)."""
    import torch
    from torch import nn

    b = request.against_model
    torch.manual_seed(seed)  # a model built from random weights (--weights none) is built as A was
    if isinstance(b, nn.Module):
        from inspect_model.loading.user_models import private_copy

        model, name = private_copy(b, type(b).__name__), type(b).__name__
        model.to(device=device)
    else:
        spec = b if b is not None else mopts.model
        checkpoint = request.against_checkpoint if request.against_checkpoint else (
            None if b is not None else mopts.checkpoint)
        loaded = load(dataclasses.replace(mopts, model=spec, checkpoint=checkpoint), device=device)
        model, name = loaded.model, loaded.name + (f" + {checkpoint}" if checkpoint else "")
        if loaded.borrowed:
            from inspect_model.loading.user_models import private_copy

            model = private_copy(model, name)
    if shares_modules(model, a_model):  # a factory that hands out one cached instance: B gets its own copy
        from inspect_model.methods.compare.versions import copy_of

        model = copy_of(model)
    if dtype != torch.float32:
        model.to(dtype)
    return model.eval(), name


def shares_modules(b: Any, a: Any) -> bool:
    return a is not None and bool({id(m) for m in b.modules()} & {id(m) for m in a.modules()})


def _call(binding: Any) -> Any:
    def call(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if binding is not None and hasattr(binding, "call"):
            return binding.call(batch.tensor)
        return (batch.tensor,), {}
    return call


def _side(prep: Any, mopts: ModelOptions, request: Any, a_layers: list[str], notes: Any) -> tuple[Any, Any, str]:
    """(side B, the layer matching, B's name)."""
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.compare import match, sides, versions

    a_model = prep.loaded.model
    a_modules = dict(a_model.named_modules())
    if request.way() in ("model", "checkpoint"):
        b_model, b_name = _side_b_model(mopts, request, prep.device, prep.dtype, prep.plan.seed, a_model)
        explicit = match.read_map(request.map) if request.map else None
        b_layers = select_layers(b_model)
        m = match.match_layers(a_layers, a_modules, b_layers, dict(b_model.named_modules()), explicit)
        names = {b: a for a, b in m.pairs.items()}
        return sides.EagerSide(b_model, names), m, b_name
    if request.map:
        from inspect_model.errors import UsageError

        raise UsageError("--map applies to two models; a version of A has A's layer names")
    m = match.Matching({n: n for n in a_layers}, {n: "name" for n in a_layers}, (), ())
    device = versions.check_device(request.against_device) if request.against_device else None
    try:
        side = versions.other_side(a_model, {n: n for n in a_layers}, way=request.against, dtype=request.against_dtype,
                                   device=device, train=request.against_train)
    except InspectModelError:
        raise
    except Exception as exc:
        raise versions.refuse_way(request.way(), exc) from exc
    return side, m, prep.loaded.name


def activations(mopts: ModelOptions, inputs: InputOptions, request: Any, *, notes: Any = None) -> Result:
    """Both sides on the inputs (see the module docstring)."""
    import torch

    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.compare import report as rep
    from inspect_model.methods.compare.passes import run_batches
    from inspect_model.run.pipeline import prepare

    prep = prepare("compare", mopts, inputs, notes=notes, request=request)
    a_model = prep.loaded.model
    a_layers = select_layers(a_model, list(request.layers) or None)
    side, m, b_name = _side(prep, mopts, request, a_layers, notes)
    low = getattr(torch, request.against_dtype) if request.against_dtype else None
    try:
        done = run_batches(a_model, side, prep.plan.batches(), _call(prep.binding), m.pairs,
                           tolerance=request.tolerance, low=low)
    except InspectModelError:
        raise
    except Exception as exc:
        if request.against in ("compiled", "export", "torchscript"):
            from inspect_model.methods.compare.versions import refuse_way

            raise refuse_way(request.against, exc) from exc
        raise ModelRuntimeError(f"compare: a forward pass failed: {one_line(exc)}") from exc
    types = {n: type(mod).__name__ for n, mod in a_model.named_modules() if n in m.pairs}
    rows = rep.layer_rows(done.sums, done.order, m.pairs, m.how, types, tolerance=request.tolerance,
                          low=low is not None)
    report = rep.CompareReport(
        model=prep.loaded.name, other=b_name, against=request.way(), mode="activations", tolerance=request.tolerance,
        fail_above=request.fail_above, matched=len(m.pairs), matched_by=dict(Counter(m.how.values())),
        **rep.divergence(rows, request.fail_above), layers=tuple(rows), outputs=tuple(rep.outputs_of(done.outputs)),
        weights=(), unmatched_a=m.unmatched_a, unmatched_b=m.unmatched_b, memory=done.memory(side))
    options = prep.options(mopts, **request.resolved())
    return _result(report, options, request)


def weights_only(mopts: ModelOptions, inputs: InputOptions, request: Any, *, notes: Any = None) -> Result:
    """Parameters and buffers of A against B's (no inputs)."""
    import torch

    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.methods.compare import match, report as rep
    from inspect_model.methods.compare.versions import copy_of
    from inspect_model.methods.compare.weights import compare_weights, weight_layers

    import torch as _torch

    _torch.manual_seed(inputs.seed)
    loaded = load(mopts)
    for note in loaded.notes:
        if notes is not None:
            notes(note)
    dtype = parse_dtype(mopts.dtype)
    a_model = loaded.model
    if request.against_dtype:
        b_model, b_name = copy_of(a_model).to(getattr(torch, request.against_dtype)), \
            f"{loaded.name} ({request.way()})"
    else:
        b_model, b_name = _side_b_model(mopts, request, "cpu", dtype, inputs.seed, a_model)
    explicit = match.read_map(request.map) if request.map else None
    a_layers, b_layers = weight_layers(a_model), weight_layers(b_model)
    m = match.match_layers(a_layers, dict(a_model.named_modules()), b_layers, dict(b_model.named_modules()), explicit)
    changes = compare_weights(a_model, b_model, m.pairs)
    past = [w for w in changes if w.relative_change is None or w.relative_change > request.tolerance]
    failing = None if request.fail_above is None else next(
        (w for w in changes if w.relative_change is None or w.relative_change > request.fail_above), None)
    report = rep.CompareReport(
        model=loaded.name, other=b_name, against=request.way(), mode="weights", tolerance=request.tolerance,
        fail_above=request.fail_above, matched=len(m.pairs), matched_by=dict(Counter(m.how.values())),
        first_divergent=past[0].name if past else None, first_failing=failing.name if failing else None,
        growth=None, nonfinite_origin_a=None, nonfinite_origin_b=None, overflow_layers=(), underflow_layers=(),
        layers=(), outputs=(), weights=tuple(changes), unmatched_a=m.unmatched_a, unmatched_b=m.unmatched_b,
        memory=rep.MemoryUse("none", 0, 0))
    options = {"model": mopts.spec(), "weights": mopts.weights if isinstance(mopts.model, str) else None,
               "checkpoint": str(mopts.checkpoint) if mopts.checkpoint else None, "device": "cpu",
               "dtype": mopts.dtype, "seed": inputs.seed, "batch_size": 0, "inputs": {"kind": "none"},
               **request.resolved()}
    return _result(report, options, request)


def _result(report: Any, options: dict[str, Any], request: Any) -> Result:
    failures = []
    if report.first_failing is not None:
        row = next((r for r in (*report.layers, *report.weights) if r.name == report.first_failing), None)
        value = getattr(row, "relative_error", getattr(row, "relative_change", None))
        what = f"relative error {value:.3g}" if isinstance(value, float) else "non-finite or mismatched output"
        failures.append(f"compare: layer '{report.first_failing}' is past --fail-above {request.fail_above:g} "
                        f"({what})")
    return Result("compare", options, report.to_dict(), [], failures=failures, record=report)
