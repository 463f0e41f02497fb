"""inspect-model: open up PyTorch models (summaries, activations, gradients, saliency maps).

The public API is re-exported here lazily, so that ``import inspect_model`` (and the CLI's
``--help``) does not import torch until a function is used.
"""

from __future__ import annotations

from typing import Any

from inspect_model._version import __version__

from inspect_model.registry import COMMANDS

_LAZY = {
    # and one function per command (from the command registry): a request in, a Result out
    "Result": ("inspect_model.run.pipeline", "Result"),
    "ModelOptions": ("inspect_model.run.options", "ModelOptions"),
    "InputOptions": ("inspect_model.run.options", "InputOptions"),
    # loading and the hook engine
    "load_model": ("inspect_model.loading.sources", "load_model"),
    "register_source": ("inspect_model.loading.sources", "register_source"),
    "LoadedModel": ("inspect_model.loading.loaded", "LoadedModel"),
    "HookEngine": ("inspect_model.engine.hooks", "HookEngine"),
    "CaptureOptions": ("inspect_model.engine.hooks", "CaptureOptions"),
    "select_layers": ("inspect_model.engine.selection", "select_layers"),
    # the bare methods, each taking a model object and returning records/tensors
    "tensor_stats": ("inspect_model.methods.stats", "tensor_stats"),
    "capture_activations": ("inspect_model.methods.activations.capture", "capture_activations"),
    "compute_gradients": ("inspect_model.methods.gradients.flow", "gradients"),
    "jacobian": ("inspect_model.methods.gradients.jacobian", "jacobian"),
    "sanity_check": ("inspect_model.methods.guided.backprop", "sanity_check"),
    "compute_cams": ("inspect_model.methods.cam.maps", "compute_cams"),
    "gradcam": ("inspect_model.methods.cam.maps", "gradcam"),
    "attribute": ("inspect_model.methods.attributions.maps", "attribute"),
    "AttributionSettings": ("inspect_model.methods.attributions.options", "AttributionSettings"),
    "run_checks": ("inspect_model.methods.checks.smoke", "run_checks"),
}



def _all() -> list[str]:
    return ["__version__", *_LAZY, *(s.api_name for s in COMMANDS.values())]


def __getattr__(name: str) -> Any:
    if name == "__all__":  # the commands' names: read from the registry on first use
        return _all()
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    spec = next((s for s in COMMANDS.values() if s.api_name == name), None)
    if spec is not None:  # a command (the built-ins load with the registry; a plugin, a test's toy command)
        value = spec.api_function()
        globals()[name] = value
        return value
    raise AttributeError(f"module 'inspect_model' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *(s.api_name for s in COMMANDS.values())})
