"""Loading a model spread over devices and the disk (issue 37), through accelerate.

:func:`load_placed` is :func:`~inspect_model.loading.sources.load_model` for a run with
``--device-map``/``--max-memory``/``--offload``: the model is built empty first (accelerate's
``init_empty_weights``: parameters on the meta device, buffers real), the device table is
planned on it (:mod:`inspect_model.loading.placement`), and only then are weights allocated,
each block on its device:

- a Hugging Face model with weights: its safetensors shards read straight into the blocks
  (memory-mapped; what goes to the disk is read in place from the shards when a block runs),
  or transformers' ``from_pretrained`` with that table when the shards' names differ;
- any source with ``--checkpoint`` (torchvision, timm, user files, Hugging Face), or with
  ``--weights none``: :func:`~inspect_model.loading.blockwise.materialise` makes one block at
  a time from the checkpoint (read block by block,
  :mod:`inspect_model.loading.checkpoint_blocks`) or at random, writing it to the offload
  folder and freeing it when it belongs on the disk;
- what an empty build would lose (pretrained torchvision/timm weights, a user's code that
  makes its own weights): built whole in the dtype asked for, after a preflight, then
  dispatched.

Every path ends in accelerate's ``dispatch_model``; the model keeps ``hf_device_map``, which
:func:`inspect_model.devices.model_device` reads for the device inputs go to.
:func:`preflight` is the check before a resident build, for every source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from inspect_model.errors import ModelLoadError, one_line
from inspect_model.loading.loaded import LoadedModel, LoadRequest
from inspect_model.loading.preflight import available_memory, check_placed, estimate
from inspect_model.loading.placement import (
    Placement,
    check_gpus,
    describe,
    main_device,
    offload_folder,
    plan_device_map,
    require_accelerate,
)


def load_placed(spec: str, request: LoadRequest, placement: Placement, *, checkpoint: str | None = None,
                strict: bool = True) -> LoadedModel:
    """Build ``spec`` empty, plan its placement, give each block its weights, dispatch."""
    from inspect_model.loading.blockwise import materialise
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.loading.sources import find_source

    require_accelerate()
    check_gpus(placement)
    dtype = parse_dtype(request.dtype or "float32")
    source = find_source(spec)
    if source.name in ("torchscript", "export", "pickled"):
        raise ModelLoadError(f"{spec} is a saved {source.name} file; --device-map/--offload need a model that can "
                             "be built empty: a Hugging Face folder, timm:NAME, a torchvision name or FILE.py:NAME")
    loaded, empty, pretrained = _build(source, spec, request, checkpoint=checkpoint, strict=strict)
    dmap = plan_device_map(loaded.model, placement, dtype, free=available_memory())
    if empty:
        check_placed(estimate(loaded.model, dtype, tokens=128 if loaded.token_vocab else 0), dmap, loaded.model,
                     name=loaded.name)
    folder = offload_folder(placement, loaded.model) if "disk" in dmap.values() else None
    if empty and source.name == "hf" and loaded.weights is not None and not checkpoint:
        if not _hf_in_place(loaded, dmap, dtype):
            loaded.model = _hf_pretrained(loaded, dmap, folder, dtype)
        if not isinstance(getattr(loaded.model, "hf_device_map", None), dict):
            loaded.model.hf_device_map = dict(dmap)  # one device: transformers attaches no hooks, none needed
    elif empty:
        reader = pretrained
        if pretrained is not None:
            loaded.notes.append(f"pretrained weights {pretrained.path} read block by block")
        elif checkpoint:
            from inspect_model.loading.checkpoint_blocks import open_checkpoint

            reader, report = open_checkpoint(loaded.model, checkpoint, strict=strict, trust=request.trust_checkpoint)
            loaded.checkpoint = report
            loaded.notes.append(report.note() + " (read block by block)")
        random = materialise(loaded.model, dmap, folder, dtype, values=reader)
        if random and source.name != "hf" and not checkpoint:
            loaded.notes.append("random weights made block by block, each layer by its own reset_parameters "
                                "(a builder's own initialisation needs the whole model)")
        _dispatch(loaded.model, dmap, folder)
    else:
        _dispatch(loaded.model, dmap, folder)
    from inspect_model.loading.blockwise import trim_after_offloaded

    trim_after_offloaded(loaded.model)
    loaded.model.eval()
    loaded.device = main_device(dmap)
    loaded.notes.append(f"placement (accelerate): {describe(dmap)}"
                        + (f"; offloaded weights in {folder}" if folder else ""))
    return loaded


def _build(source: Any, spec: str, request: LoadRequest, *, checkpoint: str | None,
           strict: bool) -> tuple[LoadedModel, bool, Any]:
    """The model with its parameters on the meta device (True), or, where an empty build
    would lose its weights (:func:`~inspect_model.loading.blockwise.empty_build`), built in the
    dtype with them, the checkpoint loaded into it (False); and, for pretrained torchvision/timm
    weights read block by block, their reader (:mod:`inspect_model.loading.pretrained_blocks`)."""
    from inspect_model.loading.blockwise import empty_build, random_weights
    from inspect_model.loading.sources import building_in, load_checkpoint_into

    if source.name == "hf":
        loaded = source.load(spec, dataclasses.replace(request, empty=True, device="cpu"))
        if callable(getattr(loaded.model, "tie_weights", None)):
            loaded.model.tie_weights()  # GPT-2's head is its embedding: the plan keeps them together
        return loaded, True, None
    pretrained = None
    if source.name in ("torchvision", "timm") and not random_weights(request) and not checkpoint:
        from inspect_model.loading.pretrained_blocks import weights_file

        pretrained = weights_file(source, spec, request)
    empty = empty_build(source, spec, request, checkpoint=checkpoint, pretrained=pretrained)
    if empty is not None and pretrained is not None:
        from inspect_model.loading.pretrained_blocks import open_pretrained

        reader = open_pretrained(empty.model, pretrained)
        if reader is not None:
            return empty, True, reader
        del empty  # the file's names are not the model's: built whole below
    elif empty is not None:
        return empty, True, None
    request = dataclasses.replace(request, device="cpu")
    hint = ("its weights come from its own code, so it is built whole before it is placed; give --checkpoint FILE "
            "(then it is built empty and read block by block) or use a smaller --dtype" if source.name in
            ("file", "module") else "pretrained weights are read whole before placing; use --weights none with "
            "--checkpoint FILE (read block by block) or a smaller --dtype")
    preflight(spec, request, hint=hint)
    with building_in(request.dtype):
        loaded = source.load(spec, dataclasses.replace(request, check=fits_check(request, hint=hint)))
    if checkpoint:
        load_checkpoint_into(loaded, spec, checkpoint, device="cpu", strict=strict, trust=request.trust_checkpoint)
    return loaded, False, None


def _shard_keys(folder: str) -> dict[str, str]:
    """Tensor name -> shard file of a save_pretrained folder (one file, or an index)."""
    import json

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            return {k: os.path.join(folder, v) for k, v in json.load(fh).get("weight_map", {}).items()}
    single = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(single):
        return {}
    from safetensors import safe_open

    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def _hf_in_place(loaded: LoadedModel, dmap: dict[str, Any], dtype: Any) -> bool:
    """The shards' tensors straight into the empty model: resident blocks read (memory-mapped)
    onto their devices, disk blocks indexed to be read from the shards when they run. Nothing
    is read twice (transformers' loader reads disk-bound tensors once at load time too). False,
    and nothing done, when the shards' names are not the model's (a conversion transformers
    knows): then its own loader runs."""
    from accelerate.utils import set_module_tensor_to_device
    from safetensors import safe_open

    model = loaded.model
    files = _shard_keys(str(getattr(loaded.config, "_name_or_path", "") or ""))
    source = {id(p): n for n, p in model.named_parameters() if n in files}
    names = list(model.named_parameters(remove_duplicate=False))
    if not files or any(n not in files and id(p) not in source for n, p in names):
        return False
    kind = str(dtype).replace("torch.", "")
    index: dict[str, Any] = {}
    for name, param in names:
        key = name if name in files else source[id(param)]
        dev = _device_of(name, dmap)
        if dev == "disk":
            index[name] = {"safetensors_file": files[key], "weight_name": key}
            if param.is_floating_point():
                index[name]["dtype"] = kind  # cast as it is read: the shard may hold another dtype
            continue
        with safe_open(files[key], framework="pt") as f:
            value = f.get_tensor(key)
        where = f"cuda:{dev}" if isinstance(dev, int) else dev
        set_module_tensor_to_device(model, name, where, value=value, dtype=dtype)
    for name, buf in model.named_buffers():
        if name in files:  # persistent buffers saved with the weights
            with safe_open(files[name], framework="pt") as f:
                set_module_tensor_to_device(model, name, "cpu", value=f.get_tensor(name))
    from accelerate import dispatch_model

    with _quiet_accelerate():
        dispatch_model(model, dmap, main_device=main_device(dmap), offload_index=index or None, force_hooks=True)
    return True


def _device_of(name: str, dmap: dict[str, Any]) -> Any:
    best = max((k for k in dmap if k == "" or name == k or name.startswith(k + ".")), key=len)
    return dmap[best]


def _hf_pretrained(loaded: LoadedModel, dmap: dict[str, Any], folder: str | None, dtype: Any) -> Any:
    """transformers' own loader with our table: shards memory-mapped, disk weights in place."""
    from inspect_model.loading.hub_models import quiet_hub_logs, require, short_reason

    transformers = require("transformers")
    from inspect_model.loading.sources.hf import auto_class

    auto, _ = auto_class(transformers, loaded.config)
    path = str(getattr(loaded.config, "_name_or_path", "") or "")
    try:
        with quiet_hub_logs(), _quiet_accelerate():
            return auto.from_pretrained(path, local_files_only=True, use_safetensors=True, dtype=dtype,
                                        device_map=dmap, offload_folder=folder, config=loaded.config)
    except Exception as exc:
        raise ModelLoadError(f"cannot load {loaded.name} with --device-map/--offload: {type(exc).__name__}: "
                             f"{short_reason(exc)}") from exc


def _dispatch(model: Any, dmap: dict[str, Any], folder: str | None) -> None:
    from accelerate import dispatch_model

    try:
        with _quiet_accelerate():
            dispatch_model(model, dmap, main_device=main_device(dmap), offload_dir=folder, force_hooks=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot place the model with this device map: {type(exc).__name__}: "
                             f"{one_line(exc)}") from exc


@contextlib.contextmanager
def _quiet_accelerate() -> Iterator[None]:
    """accelerate warns "Some parameters are on the meta device because they were offloaded";
    that is what was asked for."""
    import logging

    loggers = [logging.getLogger(n) for n in ("accelerate", "accelerate.big_modeling", "accelerate.utils.modeling")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, old, strict=True):
            lg.setLevel(lv)


def preflight(spec: str, request: LoadRequest, *, tokens: int = 0, hint: str | None = None,
              shape: Any = None) -> None:
    """Before a resident build of any source: build it on the meta device (nothing allocated),
    and refuse in one line when its weights in the dtype asked for and the activations it
    keeps cannot fit (:mod:`inspect_model.loading.preflight`). A saved file (TorchScript,
    exported, pickled) is measured by its size. A build that fails on the meta device is
    left to the real build, which reports it. ``shape``: the batch and input size the run
    feeds an image model (:class:`~inspect_model.loading.preflight.InputShape`; default one
    input of the model's size)."""
    from inspect_model.loading.preflight import check_fits, estimate, with_activations
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.loading.sources import find_source

    if request.device == "meta":
        return
    source = find_source(spec)
    if source.name in ("file", "module"):
        return  # a user's class is checked in its load (fits_check): its code is not run twice
    dtype = parse_dtype(request.dtype or "float32")
    if source.name in ("torchscript", "export", "pickled"):
        from inspect_model.loading.preflight import Estimate

        size = os.path.getsize(spec)
        check_fits(Estimate(weights=size, largest_block=size, dtype="as saved"), request.device, name=spec, hint=hint)
        return
    if source.name == "hf":
        try:
            import accelerate  # noqa: F401  (transformers' meta build)
        except ImportError:
            return  # without accelerate no empty build: the build itself is the check
    if (request.model_args or {}).get("quantize"):
        return  # quantizing calibrates on real numbers: no meta build
    from inspect_model.loading.sources import building_in

    try:
        with building_in(None if source.name == "hf" else request.dtype):
            empty = source.load(spec, dataclasses.replace(request, device="meta", weights="none"))
    except ModelLoadError:
        if source.name == "hf":
            raise
        return
    except Exception:  # noqa: BLE001 - a user's code that cannot run on meta: the real build says why
        if source.name == "hf":
            raise
        return
    est = estimate(empty.model, dtype, tokens=tokens if empty.token_vocab else 0)
    if not empty.token_vocab:
        from inspect_model.loading.preflight import obviously_fits

        if obviously_fits(est, empty, shape, request.device, model_args=request.model_args):
            return  # room to spare by a bound: no meta pass (about 0.03-0.05 s on resnet50, vit_b_16)
        est = with_activations(est, empty, shape)
    check_fits(est, request.device, name=empty.name, hint=hint)


def fits_check(request: LoadRequest, *, hint: str | None = None) -> Any:
    """The preflight of a user's class, for ``LoadRequest.check``: its meta build's weights in
    the dtype asked for against the free memory. The user's ``forward`` is not run for an
    activation estimate: user code runs only where the command runs it, under its own limits
    (``check --max-seconds`` stops a model whose forward hangs; a pass here would hang first)."""
    def check(model: Any, name: str) -> None:
        from inspect_model.loading.preflight import check_fits, estimate
        from inspect_model.loading.shapes import parse_dtype

        if request.device == "meta":
            return
        est = estimate(model, parse_dtype(request.dtype or "float32"))
        check_fits(est, request.device, name=name, hint=hint)

    return check


# Commands that read each parameter's own gradient (not only gradients of layer outputs and inputs).


def refuse_offloaded(loaded: LoadedModel, command: str) -> None:
    """One line for ``grads`` on offloaded weights: accelerate loads them for each call and
    drops them after it, so no parameter keeps a gradient. Output and input gradients (cam,
    attributions, attention's gradient methods) work offloaded. The caller asks the command's
    registry entry (``parameter_gradients``)."""
    offloaded = [n for n, p in loaded.model.named_parameters() if p.device.type == "meta"]
    if offloaded:
        raise ModelLoadError(
            f"`{command}` reads each parameter's gradient, and {len(offloaded)} parameters (e.g. '{offloaded[0]}') "
            "are offloaded: accelerate loads them for each call and drops them after it, so they keep none; run "
            f"`{command}` with the weights in memory (--device-map auto with --max-memory large enough, no "
            "--offload), or use cam, attributions or attention for layer and input gradients")
