"""The ``file`` and ``module`` model sources: user code that builds the model.

``FILE.py:NAME`` (source ``file``) names a class, a factory or an instance in a Python file;
``package.module:NAME`` (source ``module``) one in an importable module. Both are loaded by
:func:`~inspect_model.loading.user_models.load_user_model`. Loading runs the file or the
module's code (only load code you trust), so a config file may name neither.
"""

from __future__ import annotations

from inspect_model.loading.loaded import LoadedModel, LoadRequest, note_ignored_weights
from inspect_model.loading.user_models import load_user_model, spec_kind


class UserCodeSource:
    """The specs of one kind of :func:`~inspect_model.loading.user_models.spec_kind`."""

    runs_code = True

    def __init__(self, kind: str) -> None:
        self.name = kind  # "file" or "module"

    def claims(self, spec: str) -> bool:
        return spec_kind(spec) == self.name

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        loaded = load_user_model(spec, device=request.device, model_args=request.model_args, empty=request.empty,
                                 check=request.check)
        return note_ignored_weights(loaded, spec, request.weights)


FILE = UserCodeSource("file")
MODULE = UserCodeSource("module")
