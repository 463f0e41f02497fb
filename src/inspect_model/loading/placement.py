"""Where a model's layers live when it does not fit one device: accelerate's placement.

``--device-map auto|balanced|sequential|FILE``, ``--max-memory 0=20GiB,cpu=30GiB`` and
``--offload [DIR]`` say it; :class:`Placement` holds them, parsed without
torch. :func:`plan_device_map` asks accelerate's ``infer_auto_device_map`` (or reads FILE)
for the module -> device table: GPUs first in index order (pipeline placement: a run moves
through the blocks, each on its device), then the CPU, then the disk. Whatever goes to the
disk is split down to the model's blocks (its ``_no_split_modules``, or the children of its
largest ``ModuleList``), so that accelerate's hooks load one block at a time.
:func:`place` builds the model empty (no weight allocated), gives each block its weights
(Hugging Face: ``from_pretrained`` with the table, the safetensors shards read memory-mapped
and disk-offloaded weights read in place; ``--weights none``: initialised one block at a
time; other sources: built in the dtype, then dispatched) and attaches accelerate's hooks
(``dispatch_model``). Those hooks wrap ``forward``; the engine's hooks are torch module
hooks, so both compose, and removing ours leaves theirs.

``--offload`` alone keeps no weight in RAM beyond what the GPUs do not hold: the weights
stream from disk block by block. ``--max-memory cpu=N`` keeps up to N resident.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from inspect_model.errors import ModelLoadError, UsageError

MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True)
class Placement:
    """What the command line asked about placement; all None/False: resident on --device."""

    device_map: str | None = None  # auto, balanced, balanced_low_0, sequential, or a JSON file
    max_memory: str | None = None  # "0=20GiB,cpu=30GiB"
    offload: bool = False
    offload_dir: str | None = None  # implies offload; default: a temporary folder

    @property
    def active(self) -> bool:
        return bool(self.device_map or self.max_memory or self.offload or self.offload_dir)

    def check(self) -> None:
        """Syntax only (no torch): fails at once with the option's name."""
        parse_max_memory(self.max_memory)
        if self.device_map and self.device_map not in MAPS:
            if not os.path.isfile(self.device_map):
                raise UsageError(f"--device-map '{self.device_map}' is not one of {', '.join(MAPS)} nor a "
                                 "JSON file mapping module names to devices")
        if self.offload_dir is not None and os.path.exists(self.offload_dir) \
                and not os.path.isdir(self.offload_dir):
            raise UsageError(f"--offload '{self.offload_dir}' is a file; give a folder (--offload takes the next "
                             "word as its folder: put MODEL and images before it, or write --offload=DIR)")


def parse_size(text: str, *, option: str = "--max-memory") -> int:
    """``20GiB``, ``60MB``, ``1.5GB``, ``1000000`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?I?B?)\s*", text.upper())
    if not m or m.group(2) not in _UNITS:
        raise UsageError(f"{option}: '{text}' is not a size such as 20GiB, 500MB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_max_memory(text: str | None) -> dict[int | str, int] | None:
    """``0=20GiB,1=20GiB,cpu=30GiB`` -> ``{0: ..., 1: ..., "cpu": ...}`` (bytes)."""
    if not text:
        return None
    out: dict[int | str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            raise UsageError(f"--max-memory '{part}' is not DEVICE=SIZE (e.g. 0=20GiB,cpu=30GiB)")
        key, size = (s.strip() for s in part.split("=", 1))
        key = key.lower().removeprefix("cuda:")
        if key.isdigit():
            out[int(key)] = parse_size(size)
        elif key in ("cpu", "mps", "disk"):
            out[key] = parse_size(size)
        else:
            raise UsageError(f"--max-memory: device '{key}' is not a GPU index, cpu or mps")
    return out or None


def read_device_map(path: str) -> dict[str, int | str]:
    """A ``--device-map`` FILE: JSON ``{"model.layers.0": 0, "lm_head": "cpu", ...}``."""
    from inspect_model.loading.parsing import load_json

    doc = load_json(path, what="device map", error=UsageError)
    if not isinstance(doc, dict) or not doc:
        raise UsageError(f"--device-map {path}: expected a JSON object mapping module names to devices")
    out: dict[str, int | str] = {}
    for k, v in doc.items():
        if isinstance(v, bool) or not (isinstance(v, int) or v in ("cpu", "disk", "mps")
                                       or (isinstance(v, str) and re.fullmatch(r"(cuda:)?\d+", v))):
            raise UsageError(f"--device-map {path}: device {v!r} of '{k}' is not a GPU index, cpu, mps or disk")
        out[str(k)] = int(v.removeprefix("cuda:")) if isinstance(v, str) and v[-1].isdigit() else v
    return out


def check_device_map(model: Any, dmap: dict[str, int | str], path: str) -> dict[str, int | str]:
    """A FILE's table must name modules of the model and place every parameter."""
    from inspect_model.errors import suggest

    modules = dict(model.named_modules())
    for name in dmap:
        if name not in modules:
            raise UsageError(f"--device-map {path}: the model has no module '{name}'"
                             f"{suggest(name, sorted(modules))}")
    for pname, _ in model.named_parameters():
        if not any(pname == k or pname.startswith(k + ".") or k == "" for k in dmap):
            raise UsageError(f"--device-map {path}: parameter '{pname}' is on no device; map it or a module above it")
    return dmap


def no_split_classes(model: Any) -> list[str]:
    """The classes accelerate must keep whole: the model's ``_no_split_modules`` (Hugging
    Face), else the class of the items of its largest ``ModuleList``/``Sequential`` (a
    torchvision or timm stage, a user's block list)."""
    declared = getattr(model, "_no_split_modules", None)
    if declared:
        return sorted(str(c) for c in declared)
    from torch import nn

    best: tuple[int, str] | None = None
    for mod in model.modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(mod) > 1:
            kinds = {type(c).__name__ for c in mod}
            if len(kinds) == 1 and (best is None or len(mod) > best[0]):
                best = (len(mod), kinds.pop())
    return [best[1]] if best else []


def plan_device_map(model: Any, placement: Placement, dtype: Any, *,
                    free: dict[int | str, int] | None = None) -> dict[str, int | str]:
    """The module -> device table for ``model`` (empty or built): FILE as given, else
    accelerate's ``infer_auto_device_map`` under ``--max-memory`` (default: each GPU's free
    memory, and the free RAM unless ``--offload`` asks to stream from disk)."""
    if placement.device_map and placement.device_map not in MAPS:
        return check_device_map(model, read_device_map(placement.device_map), placement.device_map)
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    budget = parse_max_memory(placement.max_memory) or {}
    if not budget:
        if free is None:  # internal: callers pass preflight.available_memory()
            raise ValueError("plan_device_map needs --max-memory or the free memory")
        budget = dict(free)
        if placement.offload or placement.offload_dir:
            budget["cpu"] = 0  # --offload alone: stream from disk what the GPUs do not hold
    no_split = no_split_classes(model)
    kind = placement.device_map or "auto"
    if kind.startswith("balanced") and sum(isinstance(k, int) for k in budget) > 1:
        budget = get_balanced_memory(model, max_memory=budget, no_split_module_classes=no_split, dtype=dtype,
                                     low_zero=kind == "balanced_low_0")
    dmap = dict(infer_auto_device_map(model, max_memory=budget, no_split_module_classes=no_split, dtype=dtype))
    return split_offloaded(model, dmap, no_split)


def check_gpus(placement: Placement) -> None:
    """A GPU index in --max-memory that this machine does not have: one line, not CUDA's error.
    (Called before a real load; planning itself takes any budget: tests plan for GPUs absent.)"""
    gpus = sorted(k for k in parse_max_memory(placement.max_memory) or {} if isinstance(k, int))
    if not gpus:
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus[-1] >= have:
        raise UsageError(f"--max-memory names GPU {gpus[-1]}, and this machine has "
                         f"{'no GPU' if not have else f'{have} (0-{have - 1})'}; give cpu=SIZE only, or the GPUs it has")


def split_offloaded(model: Any, dmap: dict[str, int | str], no_split: list[str]) -> dict[str, int | str]:
    """Entries on ``disk`` split into their children down to the no-split blocks (and
    modules holding weights of their own), so that accelerate loads one block per call
    (it merges a run of modules on one device into their parent)."""
    out: dict[str, int | str] = {}
    for name, dev in dmap.items():
        if dev != "disk":
            out[name] = dev
            continue
        for sub in _blocks(model.get_submodule(name) if name else model, name, set(no_split)):
            out[sub] = dev
    return out


def _blocks(module: Any, name: str, no_split: set[str]) -> list[str]:
    children = list(module.named_children())
    own = any(True for _ in module.named_parameters(recurse=False)) or \
        any(True for _ in module.named_buffers(recurse=False))
    if type(module).__name__ in no_split or not children or own:
        return [name]
    out: list[str] = []
    for child_name, child in children:
        out += _blocks(child, f"{name}.{child_name}" if name else child_name, no_split)
    return out


def describe(dmap: dict[str, int | str]) -> str:
    """``model.embed_tokens: disk; model.layers.0-31: disk; lm_head: cpu`` (runs of
    numbered blocks on one device folded)."""
    parts: list[tuple[str, str, list[int]]] = []
    for name, dev in dmap.items():
        d = f"cuda:{dev}" if isinstance(dev, int) else str(dev)
        stem, _, last = name.rpartition(".")
        if last.isdigit() and parts and parts[-1][0] == stem and parts[-1][1] == d \
                and parts[-1][2] and parts[-1][2][-1] == int(last) - 1:
            parts[-1][2].append(int(last))
            continue
        parts.append((stem, d, [int(last)]) if last.isdigit() else (name or "(model)", d, []))
    text = []
    for stem, d, idx in parts:
        label = stem if not idx else f"{stem}.{idx[0]}" + (f"-{idx[-1]}" if len(idx) > 1 else "")
        text.append(f"{label}: {d}")
    return "; ".join(text)


def main_device(dmap: dict[str, int | str]) -> str:
    """Where a dispatched model runs its inputs: the first GPU of the table, else the CPU."""
    from inspect_model.devices import placed_device

    return placed_device(dmap)


def offload_folder(placement: Placement, model: Any) -> str:
    """A fresh folder for the offloaded weights, removed with the model (and at exit): in
    ``--offload DIR`` (a disk with room), else in the system's temporary folder. Never DIR
    itself: weights a run left there must not pass for this model's."""
    import shutil
    import tempfile
    import weakref

    parent = placement.offload_dir or None
    if parent:
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise ModelLoadError(f"--offload {parent}: cannot make the folder ({exc.strerror or exc})") from exc
    folder = tempfile.mkdtemp(prefix="inspect-model-offload-", dir=parent)
    weakref.finalize(model, shutil.rmtree, folder, True)
    return folder


def save_json_map(dmap: dict[str, int | str]) -> str:
    return json.dumps(dmap, sort_keys=False)


def require_accelerate() -> Any:
    try:
        import accelerate
    except ImportError as exc:
        raise ModelLoadError('--device-map, --max-memory and --offload need accelerate; '
                             '`pip install "inspect-model[offload]"` (or `pip install accelerate`)') from exc
    return accelerate
