"""The ``export`` model source: programs written by ``torch.export.save`` (``.pt2``).

``torch.export.load`` + ``unflatten`` give a module tree with the original names: its
submodules take hooks and are given their original class names so that ``type:Conv2d``
selects them. Unless ``--trust-checkpoint`` (command line only), an archive that would
unpickle anything is refused before torch reads it (:mod:`inspect_model.loading.archive_guard`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelLoadError
from inspect_model.loading.loaded import (
    LoadedModel,
    LoadRequest,
    brief,
    from_module,
    note_ignored_weights,
)
from inspect_model.loading.saved_models import refuse_model_args, saved_kind

if TYPE_CHECKING:
    from torch import nn


class ExportSource:
    name = "export"
    runs_code = False  # without --trust-checkpoint nothing in the archive is unpickled

    def claims(self, spec: str) -> bool:
        return saved_kind(spec) == "export"

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        refuse_model_args(spec, request)
        return note_ignored_weights(load_exported(spec, device=request.device, trust=request.trust_checkpoint), spec, request.weights)


SOURCE = ExportSource()


def load_exported(path: str, *, device: str = "cpu", trust: bool = False) -> LoadedModel:
    """``torch.export.load`` + ``unflatten``: a hookable module tree with the original names.
    Unless ``trust``, the archive is inspected first and refused if loading it would unpickle
    anything (torch's loader does, with ``weights_only=False``; issue 13)."""
    import contextlib
    import warnings

    import torch

    from inspect_model.loading.archive_guard import (
        check_archive,
        forbid_full_unpickling,
    )
    from inspect_model.loading.torch_files import guard_torch_file

    guard_torch_file(path, "exported program")  # before anything inflates a record, ours or torch's
    check_archive(path, trust=trust)
    try:
        with warnings.catch_warnings(), (contextlib.nullcontext() if trust else forbid_full_unpickling(path)):
            warnings.simplefilter("ignore")
            ep = torch.export.load(path)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"exported program '{path}' cannot be loaded: {brief(exc)}") from exc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.export.unflatten(ep)
    except Exception as exc:
        raise ModelLoadError(
            f"exported program '{path}' cannot be unflattened into modules ({brief(exc)}); "
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
    loaded = from_module(model, name=os.path.basename(path), source="export",
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
