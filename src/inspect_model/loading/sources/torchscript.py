"""The ``torchscript`` model source: archives written by ``torch.jit.save``.

They load and run, but torch rejects module hooks on them (``NotImplementedError``), so they
are marked ``hookable=False``; the commands that hook layers refuse them in one line. The
archive holds a TorchScript program that torch's interpreter runs, so a config file may not
name one.
"""

from __future__ import annotations

import os

from inspect_model.errors import ModelLoadError
from inspect_model.loading.loaded import (
    LoadedModel,
    LoadRequest,
    brief,
    from_module,
    note_ignored_weights,
)
from inspect_model.loading.saved_models import refuse_model_args, saved_kind


class TorchScriptSource:
    name = "torchscript"
    runs_code = True

    def claims(self, spec: str) -> bool:
        return saved_kind(spec) == "torchscript"

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        refuse_model_args(spec, request)
        return note_ignored_weights(load_torchscript(spec, device=request.device), spec, request.weights)


SOURCE = TorchScriptSource()


def load_torchscript(path: str, *, device: str = "cpu") -> LoadedModel:
    import warnings

    import torch

    from inspect_model.loading.torch_files import guard_torch_file

    guard_torch_file(path, "TorchScript file")
    map_location = "cpu" if device == "meta" else device
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream
            model = torch.jit.load(path, map_location=map_location)
    except Exception as exc:
        raise ModelLoadError(f"TorchScript file '{path}' cannot be loaded: {brief(exc)}") from exc
    model.eval()
    loaded = from_module(model, name=os.path.basename(path), source="torchscript", device=map_location,
                     notes=[])
    loaded.hookable = False
    return loaded
