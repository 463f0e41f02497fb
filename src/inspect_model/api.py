"""The Python API: the same capabilities as the CLI, as functions over model objects.

Every function takes an ``nn.Module`` (or a model spec string, or a ``LoadedModel``) and
returns plain records; nothing is printed and no file is written. The CLI is a thin layer
over these functions. The model is always given back as it was (hooks, flags, weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError

if TYPE_CHECKING:
    from torch import nn

    from inspect_model.cli.common import ModelOptions
    from inspect_model.loading.models import LoadedModel
    from inspect_model.methods.summary import SummaryResult


def as_loaded(model: Any, *, device: str = "cpu", weights: str | None = None) -> LoadedModel:
    """Wrap a module (or load a spec) as a :class:`LoadedModel`."""
    from torch import nn

    from inspect_model.loading.models import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, nn.Module):
        return LoadedModel(model=model, name=type(model).__name__, source="python")
    if isinstance(model, str):
        return load_model(model, weights=weights, device=device)
    raise InputError(f"expected an nn.Module or a model name, got {type(model).__name__}")


def _meta_call(model: nn.Module, inputs: Sequence[Any], dtype: Any = None) -> Any:
    """Run ``model(*inputs)`` with meta copies of its parameters and buffers (floating ones
    in ``dtype`` when given, to match --dtype inputs): shapes flow, nothing is allocated,
    and the user's weights are not touched."""
    import torch
    from torch.func import functional_call

    def meta(v: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and v.is_floating_point() else None
        return torch.empty_like(v, device="meta", dtype=cast)

    state = {k: meta(v) for k, v in model.named_parameters()}
    state.update({k: meta(v) for k, v in model.named_buffers()})
    return lambda: functional_call(model, state, tuple(inputs), tie_weights=True, strict=False)


def _on_meta(model: nn.Module) -> bool:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device.type == "meta"
    return False


def summary(
    model: Any,
    *,
    input_size: Sequence[Sequence[int] | str] | None = None,
    batch_size: int = 1,
    dtype: str = "float32",
    device: str = "meta",
    depth: int | None = None,
    seed: int = 0,
) -> SummaryResult:
    """The layer table of ``model`` (see :func:`inspect_model.methods.summary.summarize`).

    ``device="meta"`` (the default) computes shapes and MACs without memory or arithmetic;
    a model that cannot run on meta falls back to a real pass on the CPU, with a note.
    """
    import torch

    from inspect_model.loading.shapes import make_example_inputs, parse_dtype, parse_size
    from inspect_model.methods.summary import summarize

    loaded = as_loaded(model, device="meta" if device == "meta" else device)
    sizes: list[tuple[int, ...]]
    if input_size:
        sizes = [parse_size(s) if isinstance(s, str) else tuple(int(d) for d in s) for s in input_size]
    elif loaded.input_sizes:
        sizes = list(loaded.input_sizes)
    else:
        raise InputError(
            f"cannot tell the input size of {loaded.name}; pass --input-size, e.g. --input-size 3x224x224"
        )
    if batch_size < 1:
        raise InputError(f"--batch-size must be 1 or more, got {batch_size}")
    torch_dtype = parse_dtype(dtype)
    m = loaded.model
    notes: list[str] = []

    def run(dev: str) -> SummaryResult:
        x = make_example_inputs(sizes, batch_size=batch_size, family=loaded.family, dtype=torch_dtype,
                                device=dev, seed=seed)
        fwd = None
        if dev == "meta" and (not _on_meta(m) or torch_dtype != torch.float32):
            fwd = _meta_call(m, x, torch_dtype)
        elif dev != "meta" and _on_meta(m):
            raise _NeedsRealModel()
        return summarize(m, x, name=loaded.name, depth=depth, forward=fwd)

    if device == "meta":
        res = run("meta")
        if res.error and _meta_limitation(res.error):
            reason = res.error
            try:
                res = run("cpu")
            except _NeedsRealModel:
                from inspect_model.loading.models import load_torchvision

                if loaded.source != "torchvision":
                    from inspect_model.errors import ModelRuntimeError

                    raise ModelRuntimeError(
                        f"the meta device cannot run this model ({reason[:100]}); use --device cpu"
                    ) from None
                real = load_torchvision(loaded.name, weights=None, device="cpu")
                m = real.model
                res = run("cpu")
            notes.append(f"the meta device could not run this model ({reason[:100]}); used a real forward pass on cpu")
    else:
        res = run(device)
    res.notes[:0] = [*loaded.notes, *notes]
    if res.error:
        found = first_layer_hint(m)
        if found is not None:
            layer, hint = found
            status = {r.name: r.status for r in res.rows}.get(layer, "not reached")
            # Only when the pass died at (or before) the first layer: an input-shape problem.
            if status != "ok" and hint not in res.error:
                res.error = f"{res.error} ({hint})"
    return res


def _meta_limitation(error: str) -> bool:
    """Whether a meta-pass error is the meta device's limit (an op with no meta kernel, a
    value read from a tensor) rather than a real model error that a CPU pass would repeat."""
    low = error.lower()
    return error.startswith("NotImplementedError") or "meta" in low or "data-dependent" in low


class _NeedsRealModel(Exception):
    pass


def first_layer_hint(model: nn.Module) -> tuple[str, str] | None:
    """What the first conv/linear layer expects, e.g. "the first layer 'conv1' (Conv2d)
    expects 3 input channels and a 4-D input (N, C, H, W)": the fix for a wrong input size."""
    from torch import nn

    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            rank = {nn.Conv1d: 3, nn.Conv2d: 4, nn.Conv3d: 5}[type(mod)] if type(mod) in (
                nn.Conv1d, nn.Conv2d, nn.Conv3d) else 4
            dims = {3: "(N, C, L)", 4: "(N, C, H, W)", 5: "(N, C, T, H, W)"}[rank]
            return name, (f"the first layer '{name}' ({type(mod).__name__}) expects {mod.in_channels} "
                          f"input channels and a {rank}-D input {dims}; set --input-size accordingly")
        if isinstance(mod, nn.Linear):
            return name, (f"the first layer '{name}' (Linear) expects {mod.in_features} features in the "
                          "last dimension; set --input-size accordingly")
        if isinstance(mod, nn.Embedding):
            return name, f"the first layer '{name}' (Embedding) expects integer token ids"
    return None


def summary_from_options(opts: ModelOptions, *, input_sizes: Sequence[str] | None, batch_size: int,
                         depth: int | None) -> SummaryResult:
    """CLI glue: load per ``opts`` (on meta where possible) and summarise."""
    from inspect_model.cli.common import load, resolve_device

    device = opts.device.lower()
    if device != "meta":
        device = resolve_device(device)
    load_device = "meta" if device == "meta" and not opts.checkpoint else ("cpu" if device == "meta" else device)
    loaded = load(opts, device=load_device)
    return summary(loaded, input_size=input_sizes, batch_size=batch_size, dtype=opts.dtype,
                   device=device, depth=depth)
