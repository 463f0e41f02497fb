"""Models with several inputs: which one the images feed, and where the others come from.

Every command feeds the model one tensor ``x`` (the images, or a seeded random input).
For a model with several inputs (``forward(self, a, b)``, ``forward(input_ids=...,
attention_mask=...)``) an :class:`InputBinding` completes that call: a forward pre-hook on
the root model, held only for the run (:meth:`InputBinding.bound`), turns ``model(x)`` into
``model(*args, **kwargs)`` with ``x`` in the image input's place and the other inputs from
``--input-size`` (seeded random; integer ids with a value range) or from ``--inputs-file``
(real tensors, loaded with ``weights_only=True``). The other inputs hold one sample (or the
file's batch) and are expanded to the batch of ``x``. Layer names and hooks are unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError, one_line
from inspect_model.loading.shapes import InputSpec, make_input, parse_input_spec

if TYPE_CHECKING:
    import torch
    from torch import nn

Key = int | str  # a position or a keyword


@dataclass
class InputBinding:
    """The full input set of a model with ``x`` at ``image_key`` (see the module docstring)."""

    image_key: Key
    image_spec: InputSpec | None
    others: dict[Key, torch.Tensor] = field(default_factory=dict)  # (B, ...) with B 1 or a file's batch
    order: list[Key] = field(default_factory=list)

    @property
    def image_label(self) -> str:
        return f"'{self.image_key}'" if isinstance(self.image_key, str) else f"#{self.image_key} (positional)"

    def describe(self) -> dict[str, Any]:
        return {"image_input": self.image_key,
                "other_inputs": {str(k): list(t.shape) for k, t in self.others.items()}}

    def call(self, x: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        n = int(x.shape[0]) if hasattr(x, "shape") and x.dim() else 1
        values: dict[Key, Any] = {self.image_key: x}
        for k, t in self.others.items():
            b = int(t.shape[0]) if t.dim() else 1
            if b == n:
                values[k] = t.to(x.device) if hasattr(x, "device") else t
            elif b == 1:
                values[k] = t.to(x.device).expand(n, *t.shape[1:])
            else:
                raise InputError(f"input {k!r} holds a batch of {b} but the images come in batches of {n}; "
                                 f"give --batch-size {b} and {b} images at a time, or a batch of 1")
        positions = sorted(k for k in values if isinstance(k, int))
        if positions != list(range(len(positions))):
            raise UsageError(f"positional inputs {positions} leave a gap; give every positional input")
        args = tuple(values[i] for i in positions)
        kwargs = {k: v for k, v in values.items() if isinstance(k, str)}
        return args, kwargs

    @contextmanager
    def bound(self, model: nn.Module) -> Iterator[None]:
        """While inside, ``model(x)`` runs as ``model(*args, **kwargs)``; the hook is always removed."""
        def hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if len(args) == 1 and not kwargs:
                return self.call(args[0])
            return None

        handle = model.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
        try:
            yield
        finally:
            handle.remove()


def plan_binding(model: Any, sizes: Sequence[str] | None, *, image_input: str | None = None,
                 inputs_file: str | Path | None = None, dtype: Any = None, device: Any = "cpu",
                 seed: int = 0) -> InputBinding | None:
    """An :class:`InputBinding` when the run has several inputs (several ``--input-size``,
    a keyword one, or ``--inputs-file``), else None (``model(x)`` as it is)."""
    specs = [parse_input_spec(s) for s in sizes or []]
    if len(specs) <= 1 and inputs_file is None and not any(s.name for s in specs) and image_input is None:
        return None
    keyed: list[tuple[Key, InputSpec | None]] = []
    pos = 0
    for s in specs:
        if s.name:
            keyed.append((s.name, s))
        else:
            keyed.append((pos, s))
            pos += 1
    from_file: dict[Key, Any] = {}
    if inputs_file is not None:
        from_file = _load_inputs_file(Path(inputs_file))
        for k in from_file:
            if k not in dict(keyed):
                keyed.append((k, None))
    keys = [k for k, _ in keyed]
    if not keys:
        raise UsageError("--image-input needs the model's inputs: give --input-size for each, or --inputs-file")
    if image_input is None:
        image_key: Key = keys[0]
    else:
        want: Key = int(image_input) if image_input.lstrip("-").isdigit() else image_input
        if want not in keys:
            raise UsageError(f"--image-input '{image_input}' is not an input; inputs: {', '.join(map(str, keys))}")
        image_key = want
    others: dict[Key, Any] = {}
    for i, (k, s) in enumerate(keyed):
        if k == image_key:
            continue
        if k in from_file:
            others[k] = from_file[k].to(device)
        elif s is not None:
            others[k] = make_input(s, 1, dtype=dtype, device=device, seed=seed + 1 + i)
    return InputBinding(image_key, dict(keyed).get(image_key), others, keys)


def _load_inputs_file(path: Path) -> dict[Key, Any]:
    import torch

    from inspect_model.loading.torch_files import guard_torch_file

    guard_torch_file(path, "inputs file", error=InputError)  # bombs and pipes refused before torch reads
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"inputs file '{path}' cannot be read as tensors (weights_only=True): "
                         f"{one_line(exc)}") from exc
    if isinstance(obj, torch.Tensor):
        obj = (obj,)
    if isinstance(obj, (tuple, list)):
        out: dict[Key, Any] = dict(enumerate(obj))
    elif isinstance(obj, dict):
        out = dict(obj)
    else:
        raise InputError(f"inputs file '{path}' holds a {type(obj).__name__}; give a tensor, a tuple or a dict")
    for k, v in out.items():
        if not isinstance(v, torch.Tensor):
            raise InputError(f"inputs file '{path}': input {k!r} is a {type(v).__name__}, not a tensor")
    return out
