"""Will the model fit? Answered before any weight is allocated (issue 37).

The model is built empty (accelerate's ``init_empty_weights``: parameters on the meta device,
nothing allocated; a Llama-3-8B config takes seconds), and :func:`estimate` reads from it the
bytes its weights need in the dtype asked for and its largest block. :func:`available_memory`
reads what this machine has free: RAM (``MemAvailable``, lowered by a cgroup's limit and an
address-space limit, ``ulimit -v``) and each GPU's free memory. :func:`check_fits` refuses,
in one line with the numbers and the ways out, a run whose weights plus the activations it
keeps cannot fit: ``needs 16.1 GB in bfloat16 (weights 16.1 GB + activations 0.1 GB); 11.2 GB
free in RAM; use --offload, --max-memory, or a smaller --dtype``, instead of the allocator's
crash (or the kernel's OOM killer) a minute later.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, replace
from typing import Any

from inspect_model.errors import ModelLoadError

HEADROOM = 0.9  # refuse when the need is above this share of what is free: torch and Python need some too


@dataclass(frozen=True)
class Estimate:
    """What a model needs, in bytes."""

    weights: int
    largest_block: int
    activations: int = 0
    dtype: str = "float32"
    activations_for: str = ""  # the input they were counted for ("batch 64 of 3x224x224")

    @property
    def total(self) -> int:
        return self.weights + self.activations


@dataclass(frozen=True)
class InputShape:
    """The input a run will feed, for the activation estimate: ``batch`` inputs of ``size``
    (None: the model's default size)."""

    batch: int = 1
    size: tuple[int, ...] | None = None

    def describe(self, default: list[tuple[int, ...]] | None) -> str:
        size = self.size or (default[0] if default and len(default) == 1 else None)
        shape = "x".join(str(d) for d in size) if size else "the default size"
        return f"batch {self.batch} of {shape}"


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def estimate(model: Any, dtype: Any, *, tokens: int = 0) -> Estimate:
    """Weight bytes of ``model`` (empty or built) with its floating parameters in ``dtype``;
    its largest block (a no-split block of the placement); for a text model of ``tokens``
    token positions, the activations of its widest layer (the logits, or the MLP)."""
    size = dtype.itemsize if hasattr(dtype, "itemsize") else 4

    def nbytes(t: Any) -> int:
        return t.numel() * (size if t.is_floating_point() else t.element_size())

    weights = sum(nbytes(p) for p in model.parameters()) + sum(nbytes(b) for b in model.buffers())
    from inspect_model.loading.placement import no_split_classes

    kinds = set(no_split_classes(model))
    blocks = [sum(nbytes(p) for p in m.parameters()) for m in model.modules() if type(m).__name__ in kinds]
    cfg = getattr(model, "config", None)
    acts = 0
    if tokens and cfg is not None:
        widest = max(int(getattr(cfg, k, 0) or 0) for k in ("vocab_size", "intermediate_size", "hidden_size"))
        acts = 4 * tokens * widest * 4  # a few float32 tensors of the widest layer's output
    return Estimate(weights=weights, largest_block=max(blocks, default=weights), activations=acts,
                    dtype=str(dtype).replace("torch.", ""))


def free_ram() -> int | None:
    """Bytes this process can still get: MemAvailable, under a cgroup limit and ``ulimit -v``."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit, encoding="ascii") as a, open(usage, encoding="ascii") as b:
                cap, used = a.read().strip(), int(b.read().strip())
            if cap.isdigit() and int(cap) < 2**60:
                found.append(int(cap) - used)
            break
        except (OSError, ValueError):
            continue
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        found.append(soft - _virtual_size())
    return max(0, min(found)) if found else None


def _virtual_size() -> int:
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available_memory() -> dict[int | str, int]:
    """Free bytes per device, as accelerate's ``max_memory`` names them: GPU index, ``cpu``."""
    import torch

    out: dict[int | str, int] = {}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out[i] = int(torch.cuda.mem_get_info(i)[0] * HEADROOM)
    ram = free_ram()
    out["cpu"] = int((ram if ram is not None else 2**50) * HEADROOM)
    return out


def check_fits(est: Estimate, device: str, *, name: str, free: dict[int | str, int] | None = None,
               hint: str | None = None) -> None:
    """Refuse (one line, exit 3) when ``est`` cannot fit on ``device`` (cpu or cuda:N)."""
    free = available_memory() if free is None else free
    key: int | str = "cpu"
    if device.startswith("cuda"):
        key = int(device.split(":", 1)[1]) if ":" in device else 0
    have = free.get(key)
    if have is None or est.total <= have:
        return
    where = "in RAM" if key == "cpu" else f"on GPU {key}"
    acts = f" + activations {gb(est.activations)}" if est.activations else ""
    acts += f" for {est.activations_for}" if acts and est.activations_for else ""
    raise ModelLoadError(
        f"{name} needs {gb(est.total)} in {est.dtype} (weights {gb(est.weights)}{acts}); {gb(have)} free {where}; "
        + (hint or ("use a smaller --batch-size or --input-size (the activations are most of it), or --offload"
                    if est.activations_for and est.activations > est.weights
                    else "use --offload, --max-memory, or a smaller --dtype (bfloat16 halves float32)")))


# Every torchvision classification model's leaf outputs, for one input of its default size, are at
# most this many times the input's float32 bytes (measured: 7x alexnet ... 1,403x regnet_y_128gf;
# tests/unit/loading/test_preflight_skip.py checks each registered model). A bound without the pass.
ACTIVATION_FACTOR = 2048
SKIP_SHARE = 0.5  # the pass is skipped when weights + that bound take at most this share of the free memory


def obviously_fits(est: Estimate, loaded: Any, shape: InputShape | None, device: str, *,
                   model_args: dict[str, Any] | None, free: dict[int | str, int] | None = None) -> bool:
    """Whether a torchvision classifier (no ``--model-arg``, its default input size) fits with
    room to spare without the meta pass: its weights plus :data:`ACTIVATION_FACTOR` times the
    batch's input bytes within :data:`SKIP_SHARE` of the free memory. Other models get the pass."""
    shape = shape or InputShape()
    sizes = loaded.input_sizes or []
    if loaded.source != "torchvision" or loaded.family != "classification" or model_args or len(sizes) != 1:
        return False
    if shape.size is not None and tuple(shape.size) != tuple(sizes[0]):
        return False
    import math

    bound = ACTIVATION_FACTOR * shape.batch * math.prod(sizes[0]) * 4
    free = available_memory() if free is None else free
    have = free.get(int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0 if device == "cuda" else "cpu")
    return have is not None and est.weights + bound <= SKIP_SHARE * have


def with_activations(est: Estimate, loaded: Any, shape: InputShape | None) -> Estimate:
    """``est`` with the activations of an image model for ``shape`` (:func:`image_activations`)."""
    shape = shape or InputShape()
    acts = image_activations(loaded, batch=shape.batch, size=shape.size)
    return replace(est, activations=acts, activations_for=shape.describe(loaded.input_sizes) if acts else "")


def image_activations(loaded: Any, *, batch: int = 1, size: tuple[int, ...] | None = None) -> int:
    """Bytes of every layer's output for a batch of ``batch`` inputs of ``size`` (default: the
    model's own input size; one tensor), float32, from a pass on the meta device (nothing
    allocated): what a forward keeps at most, and what autograd keeps for a gradient command.
    0 when the model takes no plain image tensor."""
    import torch

    sizes = [size] if size else (loaded.input_sizes or [])
    if len(sizes) != 1 or not sizes[0]:
        return 0
    total = 0

    def count(_m: Any, _i: Any, out: Any) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel() * 4

    leaves = [m for m in loaded.model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            loaded.model(torch.empty((batch, *sizes[0]), device="meta"))
    except Exception:  # noqa: BLE001 - a model that cannot run on meta: weights only
        return 0
    finally:
        for h in handles:
            h.remove()
    return total


def check_placed(est: Estimate, dmap: dict[str, Any], model: Any, *, name: str,
                 free: dict[int | str, int] | None = None) -> None:
    """A placement must fit too: what stays in RAM, plus one block streamed from disk."""
    free = available_memory() if free is None else free
    size = 2 if est.dtype in ("bfloat16", "float16") else 8 if est.dtype == "float64" else 4
    resident = 0
    for mod_name, dev in dmap.items():
        if dev == "cpu":
            mod = model.get_submodule(mod_name) if mod_name else model
            resident += sum(p.numel() * (size if p.is_floating_point() else p.element_size())
                            for p in mod.parameters())
    need = resident + (est.largest_block if "disk" in dmap.values() else 0) + est.activations
    if need > free.get("cpu", need):
        raise ModelLoadError(
            f"{name}: the placement keeps {gb(need)} in RAM ({gb(resident)} resident in {est.dtype}, one block "
            f"streamed and the activations); {gb(free['cpu'])} free; lower --max-memory cpu=... or use --offload")
