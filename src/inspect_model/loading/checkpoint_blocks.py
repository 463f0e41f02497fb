"""A checkpoint read one block at a time, for a model placed by accelerate (issue 37).

``--checkpoint FILE`` with ``--device-map``/``--max-memory``/``--offload``: the model is built
empty, and :func:`open_checkpoint` checks the file against it as
:func:`~inspect_model.loading.checkpoints.load_checkpoint` does (state dict found under its
key, wrapper prefixes stripped, missing, unexpected and mis-shaped keys refused unless
``--non-strict``), from names and shapes only. The :class:`BlockReader` it returns then reads
the tensors of one block when asked: a safetensors file through ``safe_open`` (memory-mapped,
the file closed after each block), a torch.save archive through
:func:`~inspect_model.loading.torch_files.load_torch` with ``weights_only=True`` and
``mmap=True``, opened again for each block so that the pages read are unmapped with the block
(the pickle is small: only names and shapes). A legacy pickle, or a file read with
``--trust-checkpoint``, is read once and kept (it cannot be memory-mapped).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import ModelLoadError, one_line
from inspect_model.loading.checkpoints import (
    CheckpointReport,
    extract_state_dict,
    match_state_dict,
    read_checkpoint,
    sniff,
)

_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class BlockReader:
    """``reader(names)``: the checkpoint's tensors for those model names (those it has)."""

    def __init__(self, path: str, kind: str, key: str | None, stripped: list[str], *, trust: bool,
                 budget: Any, held: dict[str, Any] | None) -> None:
        self.path, self.kind, self.key, self.stripped = path, kind, key, stripped
        self.trust, self.budget, self.held = trust, budget, held

    def _name(self, name: str) -> str:
        return "".join(self.stripped) + name  # the prefixes were stripped in this order

    def __call__(self, names: list[str]) -> dict[str, Any]:
        if self.kind == "safetensors":
            from safetensors import safe_open

            with safe_open(self.path, framework="pt") as f:
                keys = set(f.keys())
                return {n: f.get_tensor(self._name(n)) for n in names if self._name(n) in keys}
        sd = self.held
        if sd is None:
            obj = read_checkpoint(self.path, trust=self.trust, budget=self.budget)
            sd, _ = extract_state_dict(obj, self.path)
        return {n: sd[self._name(n)] for n in names if self._name(n) in sd}


def open_checkpoint(model: Any, path: str, *, strict: bool, trust: bool) -> tuple[BlockReader, CheckpointReport]:
    """Check ``path`` against ``model`` (empty: parameters on the meta device) and return a
    reader of its blocks and the report of what will be loaded."""
    import torch

    from inspect_model.loading.archive_guard import SizeBudget

    path = str(path)
    own = model.state_dict()
    budget = SizeBudget.for_model(model)
    kind = sniff(path) if _exists(path) else "missing"
    if kind == "safetensors":
        shapes = _safetensors_shapes(path)
        key = None
    else:
        obj = read_checkpoint(path, trust=trust, budget=budget)  # one-line errors for every other kind
        sd, key = extract_state_dict(obj, path)
        shapes = {k: torch.empty(tuple(v.shape), dtype=v.dtype, device="meta") for k, v in sd.items()}
        del obj
    _, report = match_state_dict(own, shapes, path, key=key, strict=strict, trust=trust)
    held = None
    if kind != "safetensors" and (trust or kind != "torch"):
        held = sd  # not memory-mapped: read once, kept
    return BlockReader(path, kind, key, report.stripped, trust=trust, budget=budget, held=held), report


def _exists(path: str) -> bool:
    import os

    return os.path.isfile(path)


def _safetensors_shapes(path: str) -> dict[str, Any]:
    """Names -> empty tensors of the file's shapes and dtypes (nothing read but the header)."""
    import torch

    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            out = {}
            for k in f.keys():
                sl = f.get_slice(k)
                dtype = getattr(torch, _SAFETENSORS_DTYPES.get(sl.get_dtype(), "float32"))
                out[k] = torch.empty(tuple(sl.get_shape()), dtype=dtype, device="meta")
            return out
    except ImportError as exc:
        raise ModelLoadError(f"checkpoint '{path}' is a safetensors file; install the `safetensors` package "
                             "to read it") from exc
    except Exception as exc:
        raise ModelLoadError(f"safetensors checkpoint '{path}' cannot be read: {one_line(exc)}") from exc
