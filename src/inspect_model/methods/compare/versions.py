"""The other side of "one model run two ways": a copy of A, changed one way.

``--against-dtype``: a copy cast to float16/bfloat16, fed inputs in that dtype;
``--against-device cuda``: a copy on the GPU; ``--against compiled|export|torchscript|
quantized``: ``torch.compile``, ``torch.export`` (in memory), ``torch.jit.trace``, or
``torch.ao.quantization.quantize_dynamic`` of every ``nn.Linear`` (int8 weights, activations
quantized per batch); ``--against-train``: a copy in train mode (dropout on, batch norm on
batch statistics; the copy's running statistics absorb the update, A's do not). A itself is
never changed: every version is made from a deep copy.
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import ModelRuntimeError, UnsupportedModelError, UsageError, one_line
from inspect_model.methods.compare import sides

WAYS = ("compiled", "export", "torchscript", "quantized")
LOW_DTYPES = ("float16", "bfloat16")


def copy_of(model: Any) -> Any:
    import copy

    try:
        return copy.deepcopy(model)
    except Exception as exc:
        raise UnsupportedModelError(f"compare needs a copy of the model and it cannot be copied ({one_line(exc)}); "
                                    "compare two model specs instead") from exc


def other_side(model: Any, names: dict[str, str], *, way: str | None, dtype: str | None, device: str | None,
               train: bool) -> Any:
    """Side B made from ``model`` (see the module docstring); ``names``: B's layer -> A's."""
    import torch

    twin = copy_of(model)
    if dtype is not None:
        return sides.EagerSide(twin.to(getattr(torch, dtype)), names, dtype=getattr(torch, dtype))
    if device is not None:
        return sides.EagerSide(twin.to(device), names, device=torch.device(device))
    if train:
        return sides.EagerSide(twin.train(), names)
    if way == "quantized":
        from torch.ao.quantization import quantize_dynamic

        return sides.EagerSide(quantize_dynamic(twin, {torch.nn.Linear}, dtype=torch.qint8), names)
    if way == "compiled":
        return sides.CompiledSide(twin, names)
    if way == "export":
        return sides.ExportSide(twin, names)
    if way == "torchscript":
        return sides.TracedSide(twin, names)
    raise UsageError(f"--against '{way}' is not one of {', '.join(WAYS)}")


def check_device(device: str) -> str:
    """``--against-device``: cuda or cuda:N on a machine that has it (one line otherwise)."""
    import torch

    key = device.strip().lower()
    if not key.startswith("cuda"):
        raise UsageError(f"--against-device '{device}' is not cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"--against-device {device}: CUDA is not available on this machine")
    return key


def refuse_way(way: str, exc: BaseException) -> ModelRuntimeError:
    """A version that torch could not make (export's or a trace's limits) as one line."""
    return ModelRuntimeError(f"--against {way}: torch could not make this version of the model: {one_line(exc)}")
