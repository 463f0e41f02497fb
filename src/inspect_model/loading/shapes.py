"""Input shapes without images: parse ``3x224x224`` and build example inputs for a model.

Per-sample shapes never include the batch dimension; ``make_example_inputs`` adds it, or,
for detection models (which take a list of images), makes a list of ``batch`` tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "float16", "bfloat16", "float64")


def parse_size(text: str) -> tuple[int, ...]:
    """``'3x224x224'`` (or ``3,224,224`` / ``3 224 224``) to ``(3, 224, 224)``."""
    raw = text.strip().lower().replace(",", "x").replace(" ", "x").replace("*", "x")
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
