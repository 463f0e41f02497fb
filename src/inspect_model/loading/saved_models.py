"""Saved model files: TorchScript archives, torch.export programs (.pt2), pickled modules.

``load_archive`` sniffs a file and loads it. TorchScript archives (``torch.jit.save``) load
and run, but torch rejects module hooks on them (``NotImplementedError``), so they are
marked ``hookable=False`` with a note naming the commands that cannot run. Exported
programs (``torch.export.save``, ``.pt2``) are turned back into a module tree with
``torch.export.unflatten``: its submodules keep the original names, take hooks, and are
given their original class names so that ``type:Conv2d`` selects them. A file written by
``torch.save(model)`` (a whole pickled model) loads only with ``--trust-checkpoint``.
``FILE.py:NAME`` and ``package.module:NAME`` specs are resolved in
:mod:`inspect_model.loading.user_models`, which this module shares its result helpers with.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, ModelLoadError

if TYPE_CHECKING:
    from torch import nn

    from inspect_model.loading.models import LoadedModel

SCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript", ".pt2", ".ep", ".bin")

# Commands that need forward hooks on inner modules (all but `models` today).
HOOK_COMMANDS = ("summary", "activations", "grads", "guided-backprop", "cam", "attention", "check")


def load_archive(path: str, *, device: str = "cpu", trust: bool = False) -> LoadedModel:
    """A saved model file: TorchScript, exported program, or (trusted) a pickled module."""
    from inspect_model.loading import checkpoints

    if not os.path.exists(path):
        hint = "" if path.endswith(SCRIPT_SUFFIXES) else (
            "; give a torchvision name (see `inspect-model models`), FILE.py:NAME or package.module:NAME"
        )
        raise ModelLoadError(f"model file '{path}' does not exist{hint}")
    if os.path.isdir(path):
        raise ModelLoadError(f"model '{path}' is a directory; give FILE.py:NAME or a saved model file")
    kind = checkpoints.sniff(path)
    if kind == "torchscript":
        return load_torchscript(path, device=device)
    if kind == "export":
        return load_exported(path, device=device, trust=trust)
    if kind in ("torch", "legacy"):
        return _load_pickled_model(path, device=device, trust=trust)
    if kind == "empty":
        raise ModelLoadError(f"model file '{path}' is empty")
    if kind == "corrupt-zip":
        raise ModelLoadError(f"model file '{path}' is a truncated or corrupt archive; save it again")
    raise ModelLoadError(
        f"model file '{path}' is not a TorchScript file, an exported program (.pt2) or a torch.save file"
    )


def _load_pickled_model(path: str, *, device: str, trust: bool) -> LoadedModel:
    from torch import nn

    from inspect_model.loading import checkpoints
    from inspect_model.loading.user_models import _finish

    obj = checkpoints.read_checkpoint(path, device=device, trust=trust, what="model file")
    if isinstance(obj, nn.Module):
        obj.eval()
        return _finish(obj, name=os.path.basename(path), source="pickle", device=device,
                       notes=[f"whole pickled model loaded from {path} (--trust-checkpoint)"])
    raise ModelLoadError(
        f"'{path}' holds weights (a {type(obj).__name__}), not a model; give the model as "
        f"FILE.py:NAME or a torchvision name and pass --checkpoint {path}"
    )


def load_torchscript(path: str, *, device: str = "cpu") -> LoadedModel:
    import warnings

    import torch

    from inspect_model.loading.user_models import _brief, _finish

    map_location = "cpu" if device == "meta" else device
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream
            model = torch.jit.load(path, map_location=map_location)
    except Exception as exc:
        raise ModelLoadError(f"TorchScript file '{path}' cannot be loaded: {_brief(exc)}") from exc
    model.eval()
    loaded = _finish(model, name=os.path.basename(path), source="torchscript", device=map_location,
                     notes=[])
    loaded.hookable = False
    return loaded


def load_exported(path: str, *, device: str = "cpu", trust: bool = False) -> LoadedModel:
    """``torch.export.load`` + ``unflatten``: a hookable module tree with the original names.
    Unless ``trust``, the archive is inspected first and refused if loading it would unpickle
    anything (torch's loader does, with ``weights_only=False``; issue 13)."""
    import contextlib
    import warnings

    import torch

    from inspect_model.loading.archive_guard import check_archive, forbid_full_unpickling
    from inspect_model.loading.user_models import _brief, _finish

    check_archive(path, trust=trust)
    try:
        with warnings.catch_warnings(), (contextlib.nullcontext() if trust else forbid_full_unpickling(path)):
            warnings.simplefilter("ignore")
            ep = torch.export.load(path)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"exported program '{path}' cannot be loaded: {_brief(exc)}") from exc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.export.unflatten(ep)
    except Exception as exc:
        raise ModelLoadError(
            f"exported program '{path}' cannot be unflattened into modules ({_brief(exc)}); "
            "export it again with torch.export.export(model, args) (not strict=False tracing of a wrapper)"
        ) from exc
    _restore_class_names(model, ep)
    if device not in ("cpu", "meta"):
        model.to(device)
    sizes, static_batch = _export_input_sizes(ep)
    notes = [(
        "exported program: layers rebuilt with torch.export.unflatten; the graph is fixed "
        "(train/eval and inplace flags have no effect, layers are not nn.ReLU/nn.Conv2d instances)"
    )]
    loaded = _finish(model, name=os.path.basename(path), source="export",
                     device="cpu" if device == "meta" else device, notes=notes)
    if sizes:
        loaded.input_sizes = sizes
    loaded.static_batch = static_batch
    return loaded


def _hint(d: Any) -> int:
    """An int for a dimension, using the example value of a symbolic (dynamic) one."""
    if isinstance(d, int):
        return d
    hint = getattr(getattr(d, "node", None), "hint", None)
    return int(hint) if hint is not None else 1


_CLASS_CACHE: dict[tuple[type, str], type] = {}


def _restore_class_names(model: nn.Module, ep: Any) -> None:
    """Give each InterpreterModule a subclass named after the module it came from, so
    reports say Conv2d and ``type:Conv2d`` selects it. Behaviour is unchanged."""
    types: dict[str, str] = {}
    for node in ep.graph.nodes:
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            try:
                fqn, ty = entry
            except (TypeError, ValueError):
                continue
            types.setdefault(str(fqn), str(ty))
    for name, mod in model.named_modules():
        ty = types.get(name) or getattr(mod, "_ty", None)
        if not ty or name == "":
            continue
        short = str(ty).rsplit(".", 1)[-1].strip("'>")
        if not short.isidentifier() or type(mod).__name__ == short:
            continue
        base = type(mod)
        cls = _CLASS_CACHE.get((base, short))
        if cls is None:
            cls = type(short, (base,), {"__module__": base.__module__, "__qualname__": short,
                                        "_original_type": str(ty)})
            _CLASS_CACHE[(base, short)] = cls
        mod.__class__ = cls


def _export_input_sizes(ep: Any) -> tuple[list[tuple[int, ...]], int | None]:
    """Per-sample shapes of the user inputs, and the batch size if it was fixed at export."""
    import torch

    user = set(ep.graph_signature.user_inputs)
    sizes: list[tuple[int, ...]] = []
    static: int | None = None
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            continue
        dims = [_hint(d) for d in val.shape[1:]]
        sizes.append(tuple(dims))
        b = val.shape[0]
        if isinstance(b, int) and static is None:
            static = int(b)
    return sizes, static


def check_static_batch(loaded: Any, batch_size: int, images: int | None = None) -> None:
    """torch.export fixed the batch dimension of ``loaded``: every batch must have exactly
    that size. One message saying so and how to fix it (issue 13)."""
    static = getattr(loaded, "static_batch", None)
    if static is None:
        return
    fix = "or export it again with a dynamic batch dimension (dynamic_shapes={'x': {0: torch.export.Dim('batch')}})"
    if batch_size != static:
        raise InputError(f"{loaded.name} was exported with a static batch size of {static}; pass --batch-size "
                         f"{static} (got {batch_size}), {fix}")
    if images is not None and images % static:
        raise InputError(f"{loaded.name} was exported with a static batch size of {static}, and {images} images "
                         f"do not fill whole batches; give a multiple of {static} images, {fix}")
