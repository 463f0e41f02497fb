"""The Python API: one function per command, each a request in and a :class:`Result` out.

``im.cam(model, images, methods=[...])``, ``im.activations``, ``im.grads``,
``im.guided_backprop``, ``im.summary`` and ``im.check`` take a model (a spec such as
``resnet18``, an ``nn.Module`` or a ``LoadedModel``) and images (paths, or a tensor
(N, C, H, W)). The result's ``to_dict()`` is exactly the CLI's ``--json`` document and
``save(dir)`` writes exactly the CLI's files; nothing is printed. The model is always
given back as it was (hooks, flags, weights).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from inspect_model.run.options import InputOptions, ModelOptions
from inspect_model.run.session import Result
from inspect_model.registry import COMMANDS

# Every module here registers its command (``@command`` on its API function), in import order.
for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

# One function per command, from the command registry (eager: ``from inspect_model.api
# import cam`` gives the function, not the module).
for _spec in COMMANDS.values():
    globals()[_spec.api_name] = _spec.api_function()

__all__ = ["InputOptions", "ModelOptions", "Result", *(s.api_name for s in COMMANDS.values())]


def __getattr__(name: str) -> Any:
    spec = next((s for s in COMMANDS.values() if s.api_name == name), None)
    if spec is None:
        raise AttributeError(f"module 'inspect_model.api' has no attribute {name!r}")
    return spec.api_function()
