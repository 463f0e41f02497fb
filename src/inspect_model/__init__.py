"""inspect-model: open up PyTorch models (summaries, activations, gradients, saliency maps).

The public API is re-exported here lazily, so that ``import inspect_model`` (and the CLI's
``--help``) does not import torch until a function is used.
"""

from __future__ import annotations

from typing import Any

from inspect_model._version import __version__

_LAZY = {
    # one function per command: a request in, a Result out (to_dict(), save(dir))
    "summary": ("inspect_model.api", "summary"),
    "activations": ("inspect_model.api", "activations"),
    "grads": ("inspect_model.api", "grads"),
    "guided_backprop": ("inspect_model.api", "guided_backprop"),
    "cam": ("inspect_model.api", "cam"),
    "attention": ("inspect_model.api", "attention"),
    "check": ("inspect_model.api", "check"),
    "Result": ("inspect_model.api", "Result"),
    "ModelOptions": ("inspect_model.api", "ModelOptions"),
    "InputOptions": ("inspect_model.api", "InputOptions"),
    # loading and the hook engine
    "load_model": ("inspect_model.loading.models", "load_model"),
    "HookEngine": ("inspect_model.engine.hooks", "HookEngine"),
    "CaptureOptions": ("inspect_model.engine.hooks", "CaptureOptions"),
    "select_layers": ("inspect_model.engine.selection", "select_layers"),
    # the bare methods, each taking a model object and returning records/tensors
    "tensor_stats": ("inspect_model.methods.stats", "tensor_stats"),
    "capture_activations": ("inspect_model.methods.activations", "capture_activations"),
    "gradients": ("inspect_model.methods.gradients", "gradients"),
    "jacobian": ("inspect_model.methods.jacobian", "jacobian"),
    "sanity_check": ("inspect_model.methods.guided", "sanity_check"),
    "compute_cams": ("inspect_model.methods.cam", "compute_cams"),
    "gradcam": ("inspect_model.methods.cam", "gradcam"),
    "compute_attention": ("inspect_model.methods.attention", "compute_attention"),
    "AttentionCapture": ("inspect_model.engine.attention", "AttentionCapture"),
    "run_checks": ("inspect_model.methods.checks", "run_checks"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'inspect_model' has no attribute {name!r}")
