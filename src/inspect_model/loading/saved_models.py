"""What the saved-file sources share (:mod:`~inspect_model.loading.sources.torchscript`,
:mod:`~inspect_model.loading.sources.export`, :mod:`~inspect_model.loading.sources.pickled`):
telling the kind of a file from its bytes, and the rules every saved model follows.
"""

from __future__ import annotations

import os
from typing import Any

from inspect_model.errors import InputError, ModelLoadError

SCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript", ".pt2", ".ep", ".bin")


def saved_kind(spec: str) -> str | None:
    """The kind of saved model file ``spec`` is (:func:`~inspect_model.loading.checkpoints.sniff`),
    or None when it is no existing file (or a ``FILE.py:NAME``/``module:NAME`` spec)."""
    from inspect_model.loading.user_models import spec_kind

    if spec_kind(spec) != "archive" or not os.path.isfile(spec):
        return None
    from inspect_model.loading.checkpoints import sniff

    try:
        return sniff(spec)
    except OSError:
        return None


def refuse_model_args(spec: str, request: Any) -> None:
    if request.model_args:
        raise ModelLoadError(f"--model-arg does not apply to the saved model '{spec}'; it is for FILE.py:NAME specs")


def check_static_batch(loaded: Any, batch_size: int, images: int | None = None) -> None:
    """torch.export fixed the batch dimension of ``loaded``: every batch must have exactly
    that size. One message saying so and how to fix it (issue 13)."""
    static = getattr(loaded, "static_batch", None)
    if static is None:
        return
    fix = "or export it again with a dynamic batch dimension (dynamic_shapes={'x': {0: torch.export.Dim('batch')}})"
    # Fewer inputs than --batch-size make one batch of that many (issue 39): that is what runs.
    runs = batch_size if images is None else min(batch_size, images)
    if runs != static:
        got = f"--batch-size {batch_size}" if images is None or images >= batch_size else \
            f"{images} input(s), one batch of {images}"
        raise InputError(f"{loaded.name} was exported with a static batch size of {static}; pass --batch-size "
                         f"{static} (got {got}), {fix}")
    if images is not None and images % static:
        raise InputError(f"{loaded.name} was exported with a static batch size of {static}, and {images} images "
                         f"do not fill whole batches; give a multiple of {static} images, {fix}")
