"""The ``module`` model source: ``package.module:NAME`` from an importable module.

Importing the module runs its code, so a config file may not name one.
"""

from __future__ import annotations

from inspect_model.loading.loaded import LoadedModel, LoadRequest, note_ignored_weights
from inspect_model.loading.user_models import load_user_model, spec_kind


class ModuleSource:
    name = "module"
    runs_code = True

    def claims(self, spec: str) -> bool:
        return spec_kind(spec) == "module"

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        loaded = load_user_model(spec, device=request.device, model_args=request.model_args)
        return note_ignored_weights(loaded, spec, request.weights)


SOURCE = ModuleSource()
