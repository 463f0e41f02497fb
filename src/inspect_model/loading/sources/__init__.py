"""The model-source registry: which source loads a model spec, and the one ``load_model``.

A source is an object with a ``name``, ``runs_code`` (whether loading the spec runs code
from it: such specs come only from the command line, never from a config file),
``claims(spec)`` (cheap: no torch import, at most a look at the file's first bytes) and
``load(spec, request) -> LoadedModel``. :data:`SOURCES` is tried in order and the first
that claims a spec loads it; a new source is one module and one :func:`register_source`
call. Each source sets what it knows on the :class:`~inspect_model.loading.loaded.LoadedModel`:
task, class names, preprocessing, input sizes, the CAM layer it declares, the hub config.

Built-in sources, in the order they are tried: ``hf`` (``hf:ORG/NAME``, ``save_pretrained``
folders), ``timm`` (``timm:NAME``), ``torchscript``, ``export`` (``.pt2``) and ``pickled``
(saved files, told apart by their bytes), ``torchvision`` (``torchvision:NAME``, or a bare
name: no ``:``, no path), ``file`` (``FILE.py:NAME``), ``module`` (``package.module:NAME``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from inspect_model.errors import ModelLoadError, UsageError
from inspect_model.loading.loaded import LoadedModel, LoadRequest, ModelSource
from inspect_model.loading.sources import (
    export,
    hf,
    pickled,
    timm,
    torchscript,
    torchvision,
    user_code,
)

SOURCES: list[ModelSource] = [
    hf.SOURCE, timm.SOURCE, torchscript.SOURCE, export.SOURCE, pickled.SOURCE, torchvision.SOURCE, user_code.FILE,
    user_code.MODULE,
]


def register_source(source: ModelSource, *, before: str | None = None) -> None:
    """Add ``source`` to the registry: tried before the source named ``before`` (default: first,
    so that a prefix such as ``toy:`` wins over ``package.module:NAME``)."""
    if not isinstance(source, ModelSource):
        raise TypeError(f"{source!r} is not a model source (name, runs_code, claims, load)")
    unregister_source(source.name)
    names = [s.name for s in SOURCES]
    SOURCES.insert(names.index(before) if before in names else 0, source)


def unregister_source(name: str) -> None:
    SOURCES[:] = [s for s in SOURCES if s.name != name]


def find_source(spec: str) -> ModelSource:
    """The source that loads ``spec``; a path no source reads is a one-line error."""
    for source in SOURCES:
        if source.claims(spec):
            return source
    raise ModelLoadError(_unclaimed(spec))


def _unclaimed(spec: str) -> str:
    """Why nothing loads ``spec`` (a path-like spec: a saved file that is missing or unreadable)."""
    from inspect_model.loading.checkpoints import sniff

    suffixes = (".pt", ".pth", ".ts", ".jit", ".torchscript", ".pt2", ".ep", ".bin")
    if not os.path.exists(spec):
        hint = "" if spec.endswith(suffixes) else (
            "; give a torchvision name (see `inspect-model models`), FILE.py:NAME or package.module:NAME")
        return f"model file '{spec}' does not exist{hint}"
    if os.path.isdir(spec):
        return f"model '{spec}' is a directory; give FILE.py:NAME or a saved model file"
    if not os.path.isfile(spec):
        from inspect_model.loading.parsing import NOT_REGULAR

        return f"model file '{spec}' {NOT_REGULAR}"
    kind = sniff(spec)
    if kind == "empty":
        return f"model file '{spec}' is empty"
    if kind == "corrupt-zip":
        return f"model file '{spec}' is a truncated or corrupt archive; save it again"
    return f"model file '{spec}' is not a TorchScript file, an exported program (.pt2) or a torch.save file"


def code_running(spec: str) -> str | None:
    """The name of the source when loading ``spec`` runs code from it (a config file may not
    name such a model), else None. Nothing is loaded."""
    try:
        source = find_source(spec.strip())
    except ModelLoadError:
        return None  # loading fails anyway, and runs nothing
    return source.name if source.runs_code else None


def load_model(
    spec: str,
    *,
    weights: str | None = None,
    device: str = "cpu",
    model_args: dict[str, Any] | None = None,
    checkpoint: str | None = None,
    strict: bool = True,
    trust_checkpoint: bool = False,
    trust_remote_code: bool = False,
    dtype: str | None = None,
    placement: Any = None,
    check: Any = None,
) -> LoadedModel:
    """Load a model spec with the source that claims it, built in ``dtype`` directly, then
    ``checkpoint`` into it. A ``placement`` (loading.placement.Placement) spreads it over
    devices and the disk (loading.dispatch)."""
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("empty model name; e.g. `inspect-model summary resnet34`")
    spec = spec.strip()
    request = LoadRequest(weights=weights, device=device, model_args=dict(model_args or {}),
                          trust_checkpoint=trust_checkpoint, trust_remote_code=trust_remote_code, dtype=dtype,
                          check=check)
    from inspect_model.loading.sources.torchvision import WeightsNotCached

    if placement is not None and placement.active:
        from inspect_model.loading.dispatch import load_placed

        return load_placed(spec, request, placement, checkpoint=checkpoint, strict=strict)
    try:
        source = find_source(spec)
        with building_in(None if source.name in ("hf", "torchscript", "export", "pickled") else dtype):
            loaded = source.load(spec, request)
    except WeightsNotCached as exc:
        if not checkpoint:
            raise
        raise ModelLoadError(
            f"--checkpoint {checkpoint}: {spec} is built with its weights {exc.weights} first (the builder's "
            f"settings for them), and they are not cached at {exc.path} nor downloadable; add --weights none to "
            "build it without them (the checkpoint's tensors replace the weights either way), or put the file there"
        ) from exc
    from inspect_model.loading.wrappers import unwrap_loaded

    unwrap_loaded(loaded)  # torch.compile / DataParallel: the module inside (wrappers.py)
    if checkpoint:
        load_checkpoint_into(loaded, spec, checkpoint, device=device, strict=strict, trust=trust_checkpoint)
    return loaded


@contextlib.contextmanager
def building_in(dtype: str | None) -> Iterator[None]:
    """Modules built within get their parameters in ``dtype`` directly (torch's default
    dtype for the build): ``--dtype bfloat16`` never holds a float32 copy (issue 37).
    Hugging Face models are given the dtype by transformers itself; saved files keep theirs."""
    if dtype in (None, "", "float32"):
        yield
        return
    import torch

    from inspect_model.loading.shapes import parse_dtype

    old = torch.get_default_dtype()
    torch.set_default_dtype(parse_dtype(dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_checkpoint_into(loaded: LoadedModel, spec: str, checkpoint: str, *, device: str, strict: bool,
                         trust: bool) -> None:
    from inspect_model.loading import checkpoints

    if loaded.borrowed:
        # The weights go into a copy: the user's own instance is never changed (issue 9).
        from inspect_model.loading.user_models import private_copy

        loaded.model, loaded.borrowed = private_copy(loaded.model, spec), False
    report = checkpoints.load_checkpoint(loaded.model, checkpoint, device=device, strict=strict, trust=trust)
    loaded.checkpoint = report
    loaded.notes.append(report.note())


__all__ = ["SOURCES", "LoadRequest", "ModelSource", "code_running", "find_source", "load_model",
           "register_source", "unregister_source"]
