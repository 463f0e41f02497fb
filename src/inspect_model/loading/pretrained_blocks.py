"""Pretrained torchvision and timm weights placed one block at a time (issue 37).

Under ``--device-map``/``--max-memory``/``--offload`` a pretrained model is built empty and its
cached weights file (torchvision: ``TORCH_HOME/hub/checkpoints/*.pth``, its sha256 prefix checked;
timm: the Hugging Face cache's safetensors or torch file, or its URL file in torch's hub cache)
is read like ``--checkpoint``: checked against the empty model from names and shapes, then read
block by block (:mod:`inspect_model.loading.checkpoint_blocks`: ``weights_only=True``,
memory-mapped). :func:`weights_file` finds the file, or says (None) that it cannot be read that
way: a legacy pickle or NumPy archive, quantized weights. Then, and when the file's names are not
the model's (a builder that renames keys, DenseNet's; a timm head resized with
``--model-arg num_classes``), the model is built whole as before.
"""

from __future__ import annotations

from typing import Any

from inspect_model.loading.loaded import LoadRequest


def weights_file(source: Any, spec: str, request: LoadRequest) -> str | None:
    """The cached file of ``spec``'s pretrained weights when it can be read block by block."""
    from inspect_model.loading.checkpoints import sniff

    if source.name == "torchvision":
        from inspect_model.loading.sources.torchvision import ensure_weights_file, registry, resolve_weights

        name = spec.removeprefix("torchvision:")
        if registry().get(name) == "quantization" or (request.model_args or {}).get("quantize"):
            return None  # quantized weights load only into a converted model
        w = resolve_weights(name, request.weights)
        path = ensure_weights_file(w, name) if w is not None else None
    elif source.name == "timm":
        from inspect_model.loading.hub_models import require
        from inspect_model.loading.sources.timm import resolve_name, weights_file as timm_file

        timm = require("timm")
        arch, tag = resolve_name(timm, spec.split(":", 1)[1], request.weights)
        full = f"{arch}.{tag}"
        path = timm_file(timm.models.get_pretrained_cfg(full), full) if tag else None
    else:
        return None
    if path is None or sniff(path) not in ("torch", "safetensors"):
        return None  # a legacy pickle cannot be mapped: read whole, as before
    return path


def open_pretrained(model: Any, path: str) -> Any:
    """A block reader of the pretrained file for the empty ``model``, or None when the file's
    names or shapes are not the model's (then it is built whole)."""
    from inspect_model.errors import ModelLoadError
    from inspect_model.loading.checkpoint_blocks import open_checkpoint

    try:
        reader, _ = open_checkpoint(model, path, strict=True, trust=False)
    except ModelLoadError:
        return None
    return reader
