"""Input shapes without images: parse ``3x224x224`` and build example inputs for a model.

Per-sample shapes never include the batch dimension; ``make_example_inputs`` adds it, or,
for detection models (which take a list of images), makes a list of ``batch`` tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class InputSpec:
    """One model input as ``--input-size`` gives it: ``[NAME=]SHAPE[:DTYPE[:LOW-HIGH]]``.

    ``3x224x224`` (a float input), ``input_ids=16:int64:0-30522`` (integer token ids drawn
    from [0, 30522), passed as the keyword ``input_ids``), ``mask=16:int64:0-2``. ``name``
    None: a positional input."""

    shape: tuple[int, ...]
    name: str | None = None
    dtype: str | None = None  # None: the run's floating dtype
    low: int = 0
    high: int | None = None  # exclusive; integer inputs only

    @property
    def is_integer(self) -> bool:
        return self.dtype is not None and self.dtype.startswith(("int", "uint", "long", "bool"))


_INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "long", "bool")


def parse_input_spec(text: str) -> InputSpec:
    """``'ids=16:int64:0-1000'`` to an :class:`InputSpec` (see there)."""
    body = text.strip()
    name = None
    if "=" in body:
        name, body = (part.strip() for part in body.split("=", 1))
        if not name.isidentifier():
            raise UsageError(f"input size '{text}': '{name}' is not an argument name")
    parts = body.split(":")
    shape = _parse_shape(parts[0], text)
    dtype = None
    low, high = 0, None
    if len(parts) > 1 and parts[1].strip():
        dtype = parts[1].strip().lower().replace("torch.", "")
        if dtype not in _INT_DTYPES and dtype not in DTYPES:
            raise UsageError(f"input size '{text}': dtype '{dtype}' is not one of "
                             f"{', '.join(_INT_DTYPES + DTYPES)}")
        dtype = "int64" if dtype == "long" else dtype
    if len(parts) > 2:
        lo_s, sep, hi_s = parts[2].partition("-")
        try:
            low, high = int(lo_s), int(hi_s)
        except ValueError:
            raise UsageError(f"input size '{text}': value range '{parts[2]}' is not like 0-1000") from None
        if not sep or high <= low:
            raise UsageError(f"input size '{text}': value range '{parts[2]}' must be LOW-HIGH with HIGH > LOW")
    if len(parts) > 3:
        raise UsageError(f"input size '{text}' is not like [NAME=]SHAPE[:DTYPE[:LOW-HIGH]]")
    spec = InputSpec(shape, name, dtype, low, high)
    if spec.is_integer and high is None:
        raise UsageError(f"input size '{text}': an integer input needs a value range, e.g. {parts[0]}:{dtype}:0-1000")
    return spec


def parse_size(text: str) -> tuple[int, ...]:
    """``'3x224x224'`` (or ``3,224,224`` / ``3 224 224``) to ``(3, 224, 224)``; the shape of
    a full input spec (``ids=16:int64:0-1000``, see :func:`parse_input_spec`)."""
    if "=" in text or ":" in text:
        return parse_input_spec(text).shape
    return _parse_shape(text, text)


def _parse_shape(part: str, text: str) -> tuple[int, ...]:
    raw = part.strip().lower().replace(",", "x").replace(" ", "x").replace("*", "x")
    parts = [p for p in raw.split("x") if p != ""]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError as exc:
        raise UsageError(f"input size '{text}' is not like 3x224x224") from exc
    if not dims:
        raise UsageError(f"input size '{text}' is empty; e.g. 3x224x224")
    if any(d <= 0 for d in dims):
        raise InputError(f"input size '{text}' has a zero or negative dimension; every size must be >= 1")
    if len(dims) > 6:
        raise InputError(f"input size '{text}' has {len(dims)} dimensions; give the per-sample shape, e.g. 3x224x224")
    return dims


def parse_dtype(name: str | None) -> torch.dtype:
    import torch

    key = (name or "float32").lower().replace("torch.", "")
    aliases = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
               "bf16": "bfloat16", "fp64": "float64", "double": "float64"}
    key = aliases.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"dtype '{name}' is not supported; choose one of {', '.join(DTYPES)}")
    return getattr(torch, key)


def make_example_inputs(
    sizes: Sequence[tuple[int, ...]],
    *,
    batch_size: int = 1,
    family: str = "custom",
    dtype: Any = None,
    device: Any = "cpu",
    seed: int = 0,
    fill: str = "random",
    vocab: int | None = None,
) -> tuple[Any, ...]:
    """Positional arguments for ``model(*args)``: one tensor per size (batch added); with
    ``vocab``, seeded integer token ids below it (a text model's ``input_ids``)."""
    import torch

    if batch_size < 1:
        raise InputError(f"batch size must be 1 or more, got {batch_size}")
    if fill not in ("random", "zeros"):
        raise UsageError(f"input fill '{fill}' must be random or zeros")
    dtype = dtype or torch.float32
    gen = None
    if str(device) != "meta" and fill == "random":
        gen = torch.Generator(device="cpu").manual_seed(seed)

    def make(shape: tuple[int, ...]) -> torch.Tensor:
        if vocab is not None:
            if str(device) == "meta":
                return torch.empty(shape, dtype=torch.long, device="meta")
            if fill == "zeros":
                return torch.zeros(shape, dtype=torch.long, device=device)
            return torch.randint(0, vocab, shape, generator=gen, dtype=torch.long).to(device)
        if str(device) == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        if fill == "zeros":
            return torch.zeros(shape, dtype=dtype, device=device)
        # Draw on the CPU with a seeded generator: the same on every device.
        return torch.rand(shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)

    if family == "detection":
        return ([make(tuple(sizes[0])) for _ in range(batch_size)],)
    return tuple(make((batch_size, *s)) for s in sizes)


def make_input(spec: InputSpec, batch_size: int, *, dtype: Any = None, device: Any = "cpu",
               seed: int = 0) -> torch.Tensor:
    """One seeded example tensor (batch first) for ``spec``: uniform in [0, 1) for a float
    input, integers in [low, high) for an integer one (token ids, masks)."""
    import torch

    shape = (batch_size, *spec.shape)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if spec.is_integer:
        assert spec.high is not None
        t = torch.randint(spec.low, spec.high, shape, generator=gen, dtype=torch.int64)
        return t.to(dtype=getattr(torch, spec.dtype or "int64"), device=device)
    want = getattr(torch, spec.dtype) if spec.dtype else (dtype or torch.float32)
    if str(device) == "meta":
        return torch.empty(shape, dtype=want, device="meta")
    return torch.rand(shape, generator=gen, dtype=torch.float32).to(dtype=want, device=device)
