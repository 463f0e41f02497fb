"""inspect-model: open up PyTorch models (summaries, activations, gradients, saliency maps).

The public API is re-exported here lazily, so that ``import inspect_model`` (and the CLI's
``--help``) does not import torch until a function is used.
"""

from __future__ import annotations

from typing import Any

from inspect_model._version import __version__

__all__ = ["__version__", "summary", "HookEngine", "CaptureOptions", "select_layers", "tensor_stats"]

_LAZY = {
    "summary": ("inspect_model.api", "summary"),
    "HookEngine": ("inspect_model.engine.hooks", "HookEngine"),
    "CaptureOptions": ("inspect_model.engine.hooks", "CaptureOptions"),
    "select_layers": ("inspect_model.engine.selection", "select_layers"),
    "tensor_stats": ("inspect_model.methods.stats", "tensor_stats"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'inspect_model' has no attribute {name!r}")
