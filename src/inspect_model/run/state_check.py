"""Checking a resume state read back from an output directory before a session uses it (issue 41).

The weights-only unpickler builds our record classes by setting their ``__dict__`` from the
file: any field can hold anything. :func:`check_state` walks the state before
``load_state_dict`` sees it: the keys and kinds of the session's own fresh
``state_dict()`` (the template) must be there, and every field of every record must fit
its annotation (``int``, ``list[float] | None``, ``dict[str, LayerGrad]``, ``torch.Tensor``
...). A mismatch is a ``ValueError`` naming the path (``session.partial.layers['fc'].hist``),
which the runner turns into a bad-state error (exit 7), never a TypeError later on.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any

_MAX_ITEMS = 10_000_000  # values walked: a state holding more is no state of ours


def check_state(state: Any, template: Any, where: str = "session", *, command: str = "") -> None:
    """``ValueError`` unless ``state`` has the template's keys and kinds, its records fit
    their annotations (see the module docstring) and its ``entries`` (the report's images)
    fit ``command``'s report schema."""
    _like(state, template, where)
    _Walker().walk(state, where)
    if command and isinstance(template, dict) and "entries" in template and isinstance(state, dict):
        from inspect_model.run.schema_check import check_entries

        check_entries(state.get("entries"), command, f"{where}.entries")


def _kind(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__
    for kind, types_ in (("dict", dict), ("list", (list, tuple)), ("text", str), ("number", (int, float))):
        if isinstance(value, types_):
            return kind
    return type(value).__name__


def _like(value: Any, template: Any, where: str) -> None:
    """``value`` has the kind of ``template`` (None and empty containers in the template accept
    any kind there, as a fresh session has not seen an image yet); dicts recursively."""
    if template is None:
        return
    if _kind(value) != _kind(template) and not (value is None and isinstance(template, (dict, list))):
        raise ValueError(f"{where} is a {_kind(value)}, not a {_kind(template)}")
    if isinstance(template, dict) and isinstance(value, dict):
        for key, sub in template.items():
            if key not in value:
                raise ValueError(f"{where} has no {key!r}")
            if isinstance(key, str):
                _like(value[key], sub, f"{where}.{key}")


class _Walker:
    def __init__(self) -> None:
        self.seen = 0
        self.hints: dict[type, dict[str, Any]] = {}

    def walk(self, value: Any, where: str) -> None:
        import torch

        self.seen += 1
        if self.seen > _MAX_ITEMS:
            raise ValueError(f"more than {_MAX_ITEMS:,} values")
        if isinstance(value, torch.Tensor):
            _own_storage(value, where)
        elif isinstance(value, dict):
            for k, v in value.items():
                self.walk(v, f"{where}[{k!r}]")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                self.walk(v, f"{where}[{i}]")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            hints = self._hints(type(value))
            for f in dataclasses.fields(value):
                if not hasattr(value, f.name):
                    raise ValueError(f"{where} has no field '{f.name}'")
                v = getattr(value, f.name)
                hint = hints.get(f.name, Any)
                if not _fits(v, hint):
                    raise ValueError(f"{where}.{f.name} is {_show(v)}, not {_name(hint)}")
                self.walk(v, f"{where}.{f.name}")

    def _hints(self, cls: type) -> dict[str, Any]:
        if cls not in self.hints:
            import torch

            module = sys.modules.get(cls.__module__)
            try:
                self.hints[cls] = typing.get_type_hints(cls, globalns=vars(module) if module else None,
                                                        localns={"torch": torch, "Any": Any})
            except Exception:  # a name only imported for type checkers: check field by field
                self.hints[cls] = {}
                for f in dataclasses.fields(cls):
                    try:
                        self.hints[cls][f.name] = typing.get_type_hints(
                            type("_F", (), {"__annotations__": {f.name: f.type}}),
                            globalns=vars(module) if module else None, localns={"torch": torch})[f.name]
                    except Exception:
                        self.hints[cls][f.name] = Any
        return self.hints[cls]


def _own_storage(t: Any, where: str) -> None:
    """A tensor read back must hold its values: a view that repeats a few stored values over
    a huge shape (stride 0) would allocate that shape the first time it is copied."""
    need = t.numel() * t.element_size()
    have = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    if t.numel() and (need > have or any(s == 0 for s, n in zip(t.stride(), t.shape) if n > 1)):
        raise ValueError(f"{where} is a tensor of shape {list(t.shape)} over {have:,} stored bytes")


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint`` (containers checked item by item, one level
    here; the walk goes deeper)."""
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if origin in (list, typing.List):  # noqa: UP006
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value) if args else isinstance(value, list)
    if origin in (dict, typing.Dict):  # noqa: UP006
        return isinstance(value, dict) and (not args or all(_fits(k, args[0]) and _fits(v, args[1])
                                                            for k, v in value.items()))
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(_fits(v, a) for v, a in zip(value, args)))
    if origin is not None:
        hint = origin
    if not isinstance(hint, type):
        return True  # a forward reference or a construct we do not model: the walk still goes in
    if hint is float:
        return isinstance(value, (int, float))
    if hint is int:
        return isinstance(value, int)
    return isinstance(value, hint)


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _show(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    text = repr(value)
    return f"a {type(value).__name__} ({text[:40]}{'...' if len(text) > 40 else ''})"


def check_tensor_shapes(tensors: Any, expected: dict[str, tuple[int, ...]], what: str) -> None:
    """``tensors`` (name -> tensor) name only keys of ``expected``, each with that shape."""
    import torch

    if not isinstance(tensors, dict):
        raise ValueError(f"{what} is not a mapping of names to tensors")
    for name, t in tensors.items():
        if name not in expected:
            raise ValueError(f"{what} names {name!r}, which the model does not have")
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(expected[name]):
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{what} {name!r} is {got}, the model's is {list(expected[name])}")
