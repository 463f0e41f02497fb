"""Wrapped models, inspected through the module they wrap (issue 42, item 5).

``torch.compile`` returns an ``OptimizedModule`` whose forward runs a compiled graph: module
hooks on its submodules either make Dynamo break the graph at every hooked layer (a compiled
CNN's first run took 122 s and printed 40 graph-break warnings) or are not called at all, and
the compiled backward is opaque to our dispatch modes. ``DataParallel`` and
``DistributedDataParallel`` run replicas whose modules are copies, so hooks on the original
never fire on a second device, and the wrapper hides the model's class (a causal LM read as
"a model" loses its next-token target). Every command therefore runs on the wrapped module
itself: ``_orig_mod`` or ``.module``, unwrapped once where a model is loaded
(:func:`unwrap_loaded`), with a note saying why. The layer names lose the wrapper's prefix
(``_orig_mod.`` / ``module.``), as checkpoints of these models already do
(:mod:`inspect_model.loading.checkpoints`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

# Wrappers in at most this many layers (compile of DataParallel of ...): a cycle stops here.
_MAX_DEPTH = 8


def _compiled(model: Any) -> bool:
    """A ``torch.compile`` wrapper; torch._dynamo is only looked up when already imported
    (importing it costs about a second, and nothing compiled exists without it)."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    cls = getattr(dynamo, "OptimizedModule", None) if dynamo is not None else None
    if cls is not None and isinstance(model, cls):
        return True
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


def _parallel(model: Any) -> str | None:
    """``DataParallel`` / ``DistributedDataParallel`` (their class name), else None."""
    from torch import nn

    if isinstance(model, nn.DataParallel):
        return type(model).__name__
    ddp = getattr(nn.parallel, "DistributedDataParallel", None)
    if ddp is not None and isinstance(model, ddp):
        return type(model).__name__
    return None


def unwrap_module(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """The module under any ``torch.compile`` / ``DataParallel`` / DDP wrappers, and one note
    per wrapper taken off, naming the inner module's class (empty for a plain module: the
    same object back)."""
    kinds: list[str] = []
    for _ in range(_MAX_DEPTH):
        if _compiled(model):
            kinds.append("compile")
            model = model._orig_mod
        elif (kind := _parallel(model)) is not None:
            kinds.append(kind)
            model = model.module
        else:
            break
    name = type(model).__name__
    notes = [f"{name} is torch.compile'd: inspected through its original module (_orig_mod), since hooks and "
             "compiled graphs do not mix; layer names have no '_orig_mod.' prefix" if kind == "compile" else
             f"{name} is wrapped in {kind}: inspected through .module on one device, since hooks do not reach its "
             "replicas; layer names have no 'module.' prefix" for kind in dict.fromkeys(kinds)]
    return model, notes


def unwrap_loaded(loaded: Any) -> Any:
    """``loaded`` with its model unwrapped (:func:`unwrap_module`) and the notes added; the
    same record back, so a second call changes nothing."""
    model, notes = unwrap_module(loaded.model)
    if notes:
        loaded.model = model
        loaded.notes.extend(n for n in notes if n not in loaded.notes)
    return loaded
