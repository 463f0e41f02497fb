"""Weights given to an empty model one block at a time (issue 37).

A model too large for the memory is built empty first (parameters on the meta device,
buffers real: accelerate's ``init_empty_weights``), its placement planned, and only then are
its weights made, one entry of the device table at a time by :func:`materialise`: each
block's tensors are allocated on their device, filled from a checkpoint read block by block
(:class:`~inspect_model.loading.checkpoints.BlockReader`) or initialised at random (a
Hugging Face model's own ``_init_weights``, else each layer's ``reset_parameters``), and,
when the block belongs on the disk, written to the offload folder and freed before the next
block is made. Tied parameters (GPT-2's head is its embedding) are made once and shared, or
their offloaded file linked. Peak memory is then one block, whatever the model's size.

:func:`empty_build` builds a spec of any source that way, and says when it cannot (a saved
file, a user's ready-made instance, pretrained torchvision or timm weights, which their
builders read whole). :func:`return_freed_memory` keeps glibc from holding the freed blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable
from typing import Any

from inspect_model.loading.loaded import LoadedModel, LoadRequest

Values = Callable[[list[str]], dict[str, Any]]  # a block's tensor names -> the tensors a file holds


def random_weights(request: LoadRequest) -> bool:
    return str(request.weights or "none").lower() in ("none", "random", "")


def empty_build(source: Any, spec: str, request: LoadRequest, *, checkpoint: str | None,
                pretrained: str | None = None) -> LoadedModel | None:
    """``spec`` built with its parameters on the meta device, or None when its weights come
    from somewhere the empty build would lose: pretrained torchvision/timm weights whose file
    cannot be read block by block (``pretrained``: the file that can,
    :mod:`inspect_model.loading.pretrained_blocks`), a user's file without ``--checkpoint``
    (its code makes or loads the weights), a user's ready-made instance."""
    from accelerate import init_empty_weights

    from inspect_model.loading.sources import building_in

    if source.name in ("torchvision", "timm") and not random_weights(request) and not pretrained:
        return None
    if source.name in ("file", "module") and not checkpoint:
        return None
    with init_empty_weights(include_buffers=False), building_in(request.dtype):
        loaded = source.load(spec, dataclasses.replace(request, device="cpu", empty=True))
    if loaded.borrowed or not any(p.device.type == "meta" for p in loaded.model.parameters()):
        return None  # an instance made when the file was run: its weights are the file's
    return loaded


def materialise(model: Any, dmap: dict[str, Any], folder: str | None, dtype: Any, *,
                values: Values | None = None) -> list[str]:
    """Give each block of ``dmap`` its weights, in table order, one block in memory at a
    time (see the module docstring). Returns the names initialised at random."""
    import torch
    from accelerate.utils import find_tied_parameters, save_offload_index

    group_of = {n: i for i, g in enumerate(find_tied_parameters(model)) for n in g}
    made: dict[int, tuple[str, Any]] = {}  # tied group -> (first name made, its device)
    index: dict[str, Any] = {}
    random: list[str] = []
    return_freed_memory()
    init = getattr(model, "_init_weights", None)
    for name, dev in dmap.items():
        block = model.get_submodule(name) if name else model
        where = "cpu" if dev in ("disk", "cpu") else (f"cuda:{dev}" if isinstance(dev, int) else dev)
        todo = [(n, p) for n, p in block.named_parameters(remove_duplicate=False) if p.device.type == "meta"]
        own, tied = [], []
        for n, p in todo:
            group = group_of.get(_full(name, n))
            (tied if group in made else own).append((n, p))
            if group is not None and group not in made:
                made[group] = (_full(name, n), dev)
        got = values([_full(name, n) for n, _ in own] + [_full(name, n) for n, _ in block.named_buffers()]) \
            if values else {}
        missing = _fill(block, name, own, got, where, dtype, init)
        random += missing
        if dev == "disk":  # written and freed before the next block is made
            _offload(block, name, folder, index, skip={_full(name, n) for n, _ in tied})
        for n, _ in tied:
            _tie(model, block, _full(name, n), n, made[group_of[_full(name, n)]], dev, where, folder, index)
        del got
        return_freed_memory()
    if folder is not None and index:
        save_offload_index(index, folder)
    return random


def _full(block: str, name: str) -> str:
    return f"{block}.{name}" if block else name


def _owner(block: Any, name: str) -> tuple[Any, str]:
    path, _, leaf = name.rpartition(".")
    return (block.get_submodule(path) if path else block), leaf


def _set(block: Any, name: str, value: Any) -> None:
    import torch

    owner, leaf = _owner(block, name)
    old = owner._parameters[leaf]
    owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=old.requires_grad)


def _fill(block: Any, name: str, own: list[tuple[str, Any]], got: dict[str, Any], where: str, dtype: Any,
          init: Any) -> list[str]:
    """Allocate ``own`` on ``where``; initialise the block when some of them have no value
    in ``got``; copy in the values (parameters, then saved buffers). Returns those without."""
    import torch

    for n, p in own:
        _set(block, n, torch.empty(p.shape, dtype=dtype if p.is_floating_point() else p.dtype, device=where))
    missing = [_full(name, n) for n, _ in own if _full(name, n) not in got]
    with torch.no_grad():
        if missing:
            _initialise(block, init)
        for n, _ in own:
            value = got.get(_full(name, n))
            if value is not None:
                block.get_parameter(n).copy_(value)
        for n, buf in block.named_buffers():
            value = got.get(_full(name, n))
            if value is not None and buf.device.type != "meta":
                buf.copy_(value)
    return missing


def _initialise(block: Any, init: Any) -> None:
    """Hugging Face's ``_init_weights`` on every submodule (else ``reset_parameters``), and a
    small normal draw for parameters neither touches."""
    import torch

    done: set[int] = set()
    for sub in block.modules():
        if init is not None:
            init(sub)
            done.update(id(p) for p in sub.parameters(recurse=False))
        elif hasattr(sub, "reset_parameters") and callable(sub.reset_parameters):
            sub.reset_parameters()
            done.update(id(p) for p in sub.parameters(recurse=False))
    for p in block.parameters():
        if id(p) not in done and p.is_floating_point():
            torch.nn.init.normal_(p, std=0.02)


def _offload(block: Any, name: str, folder: str | None, index: dict[str, Any], *, skip: set[str]) -> None:
    """Write the block's parameters to ``folder`` (accelerate's format) and free them."""
    from accelerate.utils import offload_weight

    assert folder is not None  # internal: the table holds the disk, so a folder was made
    for n, p in list(block.named_parameters(remove_duplicate=False)):
        full = _full(name, n)
        if full in skip or p.device.type == "meta":
            continue
        offload_weight(p.detach(), full, folder, index=index)
        _set(block, n, p.detach().to("meta"))


def _tie(model: Any, block: Any, full: str, n: str, first: tuple[str, Any], dev: Any, where: str,
         folder: str | None, index: dict[str, Any]) -> None:
    """Parameter ``full`` is tied to ``first`` (made already): share it when both stay in
    memory; on the disk, read the same values (a linked file, or a written copy)."""
    from accelerate.utils import load_offloaded_weight, offload_weight

    name, first_dev = first
    if first_dev != "disk" and dev != "disk":
        owner, leaf = _owner(block, n)
        owner._parameters[leaf] = model.get_parameter(name)  # the same Parameter: tied again
    elif first_dev == "disk" and dev == "disk":
        _link_offloaded(folder, index, name, full)
    elif dev == "disk":
        assert folder is not None  # internal: the table holds the disk
        offload_weight(model.get_parameter(name).detach().cpu(), full, folder, index=index)
    else:
        assert folder is not None  # internal: the first went to the disk
        value = load_offloaded_weight(os.path.join(folder, f"{name}.dat"), index[name])
        _set(block, n, value.to(where))


def _link_offloaded(folder: str | None, index: dict[str, Any], first: str, name: str) -> None:
    """A tied parameter on the disk reads its first's file (a hard link where possible)."""
    assert folder is not None  # internal: both sides are on the disk
    src, dst = os.path.join(folder, f"{first}.dat"), os.path.join(folder, f"{name}.dat")
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    index[name] = dict(index[first])


def trim_after_offloaded(model: Any) -> None:
    """After each offloaded block's call (accelerate's ``post_forward`` drops its weights),
    give the freed memory back: a run then holds one block, not the heap's high-water mark.
    The hook objects are accelerate's (no torch hook is added: ours are counted elsewhere)."""
    for module in model.modules():
        if sum(p.numel() * p.element_size() for p in module.parameters()) < 1 << 22:
            continue  # under 4 MiB: what it frees is not worth a trim (each costs a walk of the heap)
        top = getattr(module, "_hf_hook", None)
        for hook in getattr(top, "hooks", None) or [top]:
            if not getattr(hook, "offload", False) or "post_forward" in vars(hook):
                continue
            original = hook.post_forward

            def post_forward(mod: Any, output: Any, _original: Any = original) -> Any:
                out = _original(mod, output)
                return_freed_memory()
                return out

            hook.post_forward = post_forward


_MALLOPT_DONE: list[bool] = []


def return_freed_memory() -> None:
    """Have glibc give freed blocks back to the system: with its default, a freed tensor of a
    few MB raises the threshold above which it maps memory, later tensors come from the heap,
    and the heap keeps about three blocks resident (measured on a 208 MB model). No-op
    elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        if not _MALLOPT_DONE:
            libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD fixed at 1 MiB: large tensors mapped, unmapped when freed
            _MALLOPT_DONE.append(True)
        libc.malloc_trim(0)
