"""The ``file`` model source: ``FILE.py:NAME``, a class, a factory or an instance in a Python file.

Loading runs the file (only load files you trust), so a config file may not name one.
"""

from __future__ import annotations

from inspect_model.loading.loaded import LoadedModel, LoadRequest, note_ignored_weights
from inspect_model.loading.user_models import load_user_model, spec_kind


class FileSource:
    name = "file"
    runs_code = True

    def claims(self, spec: str) -> bool:
        return spec_kind(spec) == "file"

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        loaded = load_user_model(spec, device=request.device, model_args=request.model_args)
        return note_ignored_weights(loaded, spec, request.weights)


SOURCE = FileSource()
