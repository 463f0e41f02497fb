"""The ``pickled`` model source: a whole model written by ``torch.save(model)``.

Unpickling it runs code from the file, so it loads only with ``--trust-checkpoint`` (command
line only); without it the file is refused in one line naming the option.
"""

from __future__ import annotations

import os

from inspect_model.errors import ModelLoadError
from inspect_model.loading.loaded import LoadedModel, LoadRequest, from_module, note_ignored_weights
from inspect_model.loading.saved_models import refuse_model_args, saved_kind


class PickledSource:
    name = "pickled"
    runs_code = True

    def claims(self, spec: str) -> bool:
        return saved_kind(spec) in ("torch", "legacy")

    def load(self, spec: str, request: LoadRequest) -> LoadedModel:
        refuse_model_args(spec, request)
        return note_ignored_weights(load_pickled_model(spec, device=request.device, trust=request.trust_checkpoint), spec, request.weights)


SOURCE = PickledSource()


def load_pickled_model(path: str, *, device: str, trust: bool) -> LoadedModel:
    from torch import nn

    from inspect_model.loading import checkpoints

    obj = checkpoints.read_checkpoint(path, device=device, trust=trust, what="model file")
    if isinstance(obj, nn.Module):
        obj.eval()
        return from_module(obj, name=os.path.basename(path), source="pickle", device=device,
                       notes=[f"whole pickled model loaded from {path} (--trust-checkpoint)"])
    raise ModelLoadError(
        f"'{path}' holds weights (a {type(obj).__name__}), not a model; give the model as "
        f"FILE.py:NAME or a torchvision name and pass --checkpoint {path}"
    )
