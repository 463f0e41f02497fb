"""Layer selection: one spec language for every subcommand.

A spec is one of
  * a qualified name, ``layer4.1.conv2`` (selects exactly that module, container or leaf);
  * a glob, ``layer4.*`` (the innermost matches: a match none of whose submodules also match;
    so ``layer4.*`` gives leaves and ``layer4.?`` the blocks ``layer4.0``, ``layer4.1``...);
  * a type, ``type:Conv2d`` or ``type:Conv2d|Linear`` (every module of that class name);
  * ``all`` / ``*`` (every leaf);
each optionally followed by a position: after a qualified name, among its children as in
PyTorch indexing (``layer4[-1]`` is layer4's last block, ``layer4[0:2]`` its first two);
otherwise among what the spec selected (``type:Conv2d[-1]`` is the last conv).
A ``depth`` limit keeps modules at most that deep (the root's children have depth 1) and
treats modules at exactly that depth as leaves, as torchinfo's ``depth`` does.
Several specs are united and returned in the model's module order.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from inspect_model.errors import LayerSelectionError, suggest

if TYPE_CHECKING:
    from torch import nn

_INDEX_RE = re.compile(r"^(?P<body>.*?)\[(?P<index>-?\d*(?::-?\d*)?)\]$")
_GLOB_CHARS = set("*?[")


def module_depth(name: str) -> int:
    """Nesting depth of a qualified name: '' is 0, 'layer1' is 1, 'layer1.0' is 2."""
    return 0 if name == "" else name.count(".") + 1


def module_table(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every named module (root first), each module object once, in registration order."""
    return list(model.named_modules())


def _is_leaf(module: nn.Module) -> bool:
    return next(iter(module.children()), None) is None


def _apply_index(spec: str, names: list[str], index: str) -> list[str]:
    if not names:
        return names
    try:
        if ":" in index:
            start_s, stop_s = index.split(":", 1)
            start = int(start_s) if start_s else None
            stop = int(stop_s) if stop_s else None
            picked = names[slice(start, stop)]
        else:
            i = int(index)
            picked = [names[i]]
    except (ValueError, IndexError) as exc:
        raise LayerSelectionError(
            f"layer spec '{spec}': position [{index}] is out of range; "
            f"it selects {len(names)} layer(s), positions 0..{len(names) - 1}"
        ) from exc
    return picked


def select_layers(
    model: nn.Module,
    specs: Sequence[str] | None = None,
    *,
    depth: int | None = None,
    leaves_only: bool = True,
) -> list[str]:
    """Resolve layer specs against ``model`` and return qualified names in module order.

    With no spec (or ``all``) every leaf module is selected (every module down to
    ``depth`` when it is given). Raises :class:`LayerSelectionError` for a name that does
    not exist (suggesting the closest ones) or a spec that selects nothing.
    """
    if depth is not None and depth < 1:
        raise LayerSelectionError(f"--depth must be 1 or more, got {depth}")
    table = module_table(model)
    order = {name: i for i, (name, _) in enumerate(table)}
    by_name = dict(table)
    all_names = [n for n, _ in table if n != ""]

    def frontier(names: Iterable[str]) -> list[str]:
        out = []
        for n in names:
            d = module_depth(n)
            if depth is not None and d > depth:
                continue
            if not leaves_only or _is_leaf(by_name[n]) or (depth is not None and d == depth):
                out.append(n)
        return out

    if not specs:
        specs = ["all"]
    chosen: set[str] = set()
    for raw in specs:
        spec = raw.strip()
        if not spec:
            raise LayerSelectionError("empty layer spec; give a name, a glob or type:CLASS")
        index = None
        m = _INDEX_RE.match(spec)
        # `layer[0-3]` is a glob character class, not a position: only digits/colon count.
        if m and (m.group("body") == "" or not m.group("body").endswith("[")):
            body, index = m.group("body"), m.group("index")
        else:
            body = spec
        if body in ("", "all", "*"):
            names = frontier(all_names)
            if not names and model is not None:
                names = [""]  # a model with no submodules: the model itself is the layer
        elif body.startswith("type:"):
            wanted = {t.strip().rsplit(".", 1)[-1] for t in body[5:].split("|") if t.strip()}
            if not wanted:
                raise LayerSelectionError(f"layer spec '{spec}' names no type; e.g. type:Conv2d")
            names = [
                n for n in all_names
                if type(by_name[n]).__name__ in wanted
                and (depth is None or module_depth(n) <= depth)
            ]
            if not names:
                types = sorted({type(m).__name__ for _, m in table[1:]})
                hint = suggest(next(iter(wanted)), types)
                raise LayerSelectionError(
                    f"layer spec '{spec}' selects no layer{hint or ''}"
                    + ("" if hint else f"; types in this model: {', '.join(types[:12])}")
                )
        elif any(c in body for c in _GLOB_CHARS):
            matched = [n for n in all_names if fnmatch.fnmatchcase(n, body)
                       and (depth is None or module_depth(n) <= depth)]
            if leaves_only:
                # What it matched: the innermost matches (issue 14: `layer4.?` matches blocks,
                # which used to be dropped for not being leaves).
                inner = set(matched)
                names = [n for n in matched
                         if not any(o.startswith(n + ".") for o in inner)
                         or (depth is not None and module_depth(n) == depth)]
            else:
                names = matched
            if not names:
                raise LayerSelectionError(
                    f"layer spec '{spec}' selects no layer"
                    + (suggest(body.rstrip("*.?"), all_names) or "; see `inspect-model summary MODEL` for names")
                )
        else:
            if body not in by_name or body == "":
                raise LayerSelectionError(
                    f"layer '{body}' not found"
                    + (suggest(body, all_names) or "; see `inspect-model summary MODEL` for names")
                )
            names = [body]
            if index is not None:
                # `layer4[-1]`: a position among the module's children, as PyTorch indexing.
                children = [f"{body}.{c}" for c, _ in by_name[body].named_children()]
                if not children:
                    raise LayerSelectionError(f"layer spec '{spec}': '{body}' has no children to take "
                                              f"position [{index}] of")
                names = children
        if index is not None:
            names = _apply_index(spec, names, index)
        if not names:
            raise LayerSelectionError(f"layer spec '{spec}' selects no layer")
        chosen.update(names)
    return sorted(chosen, key=order.__getitem__)
