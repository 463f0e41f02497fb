"""The names earlier code imports from ``inspect_model.loading.models``, kept working.

The model record lives in :mod:`inspect_model.loading.loaded`, the registry and
``load_model`` in :mod:`inspect_model.loading.sources`, torchvision's loader in
:mod:`inspect_model.loading.sources.torchvision`. New code imports from those.
"""

from __future__ import annotations

from inspect_model.loading.loaded import (
    TASKS,
    LoadedModel,
    LoadRequest,
    ModelSource,
    hooks_unsupported_message,
    require_hookable,
)
from inspect_model.loading.sources import find_source, load_model, register_source
from inspect_model.loading.sources.torchvision import (
    FAMILIES,
    list_models,
    load_torchvision,
    registry,
    resolve_weights,
    weights_cache_path,
)

__all__ = ["FAMILIES", "TASKS", "LoadRequest", "LoadedModel", "ModelSource", "find_source",
           "hooks_unsupported_message", "list_models", "load_model", "load_torchvision", "register_source",
           "registry", "require_hookable", "resolve_weights", "weights_cache_path"]
