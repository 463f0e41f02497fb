"""Which layer of side B is which layer of side A.

In turn: the pairs of a ``--map`` file (JSON ``{"A's layer": "B's layer"}``), then the same
qualified name, then order and shape: the layers left on both sides, in module order, are
paired when their type and their own parameters' shapes agree (a model whose blocks were
renamed). Whatever is left is listed as unmatched. The map is untrusted data: a regular
file of at most :data:`MAP_MAX_BYTES`, a flat object of strings, each a layer of its side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspect_model.errors import InputError, UsageError, suggest

MAP_MAX_BYTES = 1 << 20  # 1 MiB: a map of every layer of a very large model fits many times over
MAP_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class Matching:
    """A's layer -> B's layer, in A's order; how each pair was made; what is left."""

    pairs: dict[str, str]
    how: dict[str, str]  # A's layer -> "map" | "name" | "order"
    unmatched_a: tuple[str, ...]
    unmatched_b: tuple[str, ...]


def read_map(path: str | Path) -> dict[str, str]:
    """The ``--map`` file's pairs, checked for shape (not yet for names)."""
    from inspect_model.loading.torch_files import check_regular

    check_regular(path, "--map file", error=InputError, max_bytes=MAP_MAX_BYTES)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"--map file '{path}' is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise InputError(f"--map file '{path}' must be one JSON object of layer names: "
                         '{"A\'s layer": "B\'s layer", ...}')
    if len(data) > MAP_MAX_ENTRIES:
        raise InputError(f"--map file '{path}' has {len(data):,} entries, over the {MAP_MAX_ENTRIES:,} it may hold")
    if len(set(data.values())) != len(data):
        raise InputError(f"--map file '{path}' maps two layers of A to the same layer of B")
    return dict(data)


def signature(module: Any) -> tuple[str, tuple[tuple[int, ...], ...]]:
    """What order-and-shape matching compares: the type and the own parameters' shapes."""
    shapes = tuple(tuple(p.shape) for p in module.parameters(recurse=False))
    return type(module).__name__, shapes


def match_layers(a_layers: list[str], a_modules: dict[str, Any], b_layers: list[str], b_modules: dict[str, Any],
                 explicit: dict[str, str] | None = None) -> Matching:
    """Pair ``a_layers`` (A's compared layers, in order) with ``b_layers`` (B's candidates, in
    order); see the module docstring."""
    pairs: dict[str, str] = {}
    how: dict[str, str] = {}
    taken: set[str] = set()
    for a, b in (explicit or {}).items():
        if a not in a_modules:
            raise UsageError(f"--map: layer '{a}' is not a layer of A{suggest(a, list(a_modules))}")
        if b not in b_modules:
            raise UsageError(f"--map: layer '{b}' is not a layer of B{suggest(b, list(b_modules))}")
        pairs[a], how[a] = b, "map"
        taken.add(b)
    for a in a_layers:
        if a not in pairs and a in b_modules and a not in taken:
            pairs[a], how[a] = a, "name"
            taken.add(a)
    rest_b = [b for b in b_layers if b not in taken]
    start = 0
    for a in a_layers:
        if a in pairs:
            continue
        want = signature(a_modules[a])
        for j in range(start, len(rest_b)):
            if signature(b_modules[rest_b[j]]) == want:
                pairs[a], how[a] = rest_b[j], "order"
                taken.add(rest_b[j])
                start = j + 1
                break
    order = {n: i for i, n in enumerate(a_layers)}
    ordered = dict(sorted(pairs.items(), key=lambda kv: order.get(kv[0], len(order))))
    return Matching(ordered, how, tuple(a for a in a_layers if a not in pairs),
                    tuple(b for b in b_layers if b not in taken))
