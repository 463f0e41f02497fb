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
from dataclasses import dataclass, field
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
    tree = _Tree(model, table, depth, leaves_only)
    if not specs:
        specs = ["all"]
    chosen: set[str] = set()
    for raw in specs:
        chosen.update(_select_one(tree, raw.strip()))
    return sorted(chosen, key=order.__getitem__)


@dataclass
class _Tree:
    """The model's modules and the options that every spec is resolved under."""

    model: nn.Module
    table: list[tuple[str, nn.Module]]
    depth: int | None
    leaves_only: bool
    by_name: dict[str, nn.Module] = field(init=False)
    all_names: list[str] = field(init=False)  # every module but the root, in module order

    def __post_init__(self) -> None:
        self.by_name = dict(self.table)
        self.all_names = [n for n, _ in self.table if n != ""]

    def within_depth(self, name: str) -> bool:
        return self.depth is None or module_depth(name) <= self.depth

    def frontier(self, names: Iterable[str]) -> list[str]:
        """``names`` down to the depth limit; with ``leaves_only``, only leaves and modules at
        exactly the depth limit (which stand for their subtrees)."""
        out = []
        for n in names:
            d = module_depth(n)
            if self.depth is not None and d > self.depth:
                continue
            if not self.leaves_only or _is_leaf(self.by_name[n]) or (self.depth is not None and d == self.depth):
                out.append(n)
        return out


def _split_index(spec: str) -> tuple[str, str | None]:
    """``layer4[-1]`` -> ("layer4", "-1"); a spec with no position -> (spec, None)."""
    m = _INDEX_RE.match(spec)
    # `layer[0-3]` is a glob character class, not a position: only digits/colon count.
    if m and (m.group("body") == "" or not m.group("body").endswith("[")):
        return m.group("body"), m.group("index")
    return spec, None


def _select_one(tree: _Tree, spec: str) -> list[str]:
    """The names one (stripped) spec selects; never empty."""
    if not spec:
        raise LayerSelectionError("empty layer spec; give a name, a glob or type:CLASS")
    body, index = _split_index(spec)
    if body in ("", "all", "*"):
        names = tree.frontier(tree.all_names)
        if not names and tree.model is not None:
            names = [""]  # a model with no submodules: the model itself is the layer
    elif body.startswith("type:"):
        names = _select_type(tree, spec, body)
    elif any(c in body for c in _GLOB_CHARS):
        names = _select_glob(tree, spec, body)
    else:
        names = _select_name(tree, spec, body, index)
    if index is not None:
        names = _apply_index(spec, names, index)
    if not names:
        raise LayerSelectionError(f"layer spec '{spec}' selects no layer")
    return names


def _select_type(tree: _Tree, spec: str, body: str) -> list[str]:
    """``type:Conv2d|Linear``: every module of those class names (a dotted path's last part)."""
    wanted = {t.strip().rsplit(".", 1)[-1] for t in body[5:].split("|") if t.strip()}
    if not wanted:
        raise LayerSelectionError(f"layer spec '{spec}' names no type; e.g. type:Conv2d")
    names = [n for n in tree.all_names if type(tree.by_name[n]).__name__ in wanted and tree.within_depth(n)]
    if not names:
        types = sorted({type(m).__name__ for _, m in tree.table[1:]})
        hint = suggest(next(iter(wanted)), types)
        raise LayerSelectionError(
            f"layer spec '{spec}' selects no layer{hint or ''}"
            + ("" if hint else f"; types in this model: {', '.join(types[:12])}")
        )
    return names


def _select_glob(tree: _Tree, spec: str, body: str) -> list[str]:
    """A glob over qualified names; with ``leaves_only``, the innermost matches."""
    matched = [n for n in tree.all_names if fnmatch.fnmatchcase(n, body) and tree.within_depth(n)]
    if tree.leaves_only:
        # What it matched: the innermost matches (issue 14: `layer4.?` matches blocks,
        # which used to be dropped for not being leaves).
        inner = set(matched)
        names = [n for n in matched
                 if not any(o.startswith(n + ".") for o in inner)
                 or (tree.depth is not None and module_depth(n) == tree.depth)]
    else:
        names = matched
    if not names:
        raise LayerSelectionError(
            f"layer spec '{spec}' selects no layer"
            + (suggest(body.rstrip("*.?"), tree.all_names) or "; see `inspect-model summary MODEL` for names")
        )
    return names


def _select_name(tree: _Tree, spec: str, body: str, index: str | None) -> list[str]:
    """A qualified name; with a position, that module's children (indexed by the caller)."""
    if body not in tree.by_name and body:
        body = _canonical(tree, body) or body
    if body not in tree.by_name or body == "":
        raise LayerSelectionError(
            f"layer '{body}' not found"
            + (suggest(body, tree.all_names) or "; see `inspect-model summary MODEL` for names")
        )
    if index is None:
        return [body]
    # `layer4[-1]`: a position among the module's children, as PyTorch indexing.
    children = [f"{body}.{c}" for c, _ in tree.by_name[body].named_children()]
    if not children:
        raise LayerSelectionError(f"layer spec '{spec}': '{body}' has no children to take "
                                  f"position [{index}] of")
    return children


def _canonical(tree: _Tree, name: str) -> str | None:
    """The listed name of a module registered under several names (``self.head = self.fc``:
    PyTorch lists it once, under its first name), or None when ``name`` is no module."""
    try:
        module = tree.model.get_submodule(name)
    except (AttributeError, ValueError):
        return None
    return next((n for n, m in tree.table if m is module and n), None)
