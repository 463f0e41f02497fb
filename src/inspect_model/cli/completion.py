"""Shell completion: torchvision model names (from a list shipped in the package, so no
torch import) and layer names of a model (built once, then cached on disk: the first
completion pays for importing torch, later ones are instant)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any


def command_names() -> tuple[str, ...]:
    """The subcommands, in the order `inspect-model --help` lists them (the registry's)."""
    from inspect_model.registry import names

    return names()


def model_names() -> list[str]:
    text = resources.files("inspect_model").joinpath("data/torchvision_models.txt").read_text(encoding="utf-8")
    return [n for n in text.split() if n]


def complete_model(incomplete: str) -> list[str]:
    return [n for n in model_names() if n.startswith(incomplete)]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "inspect-model" / "layers"


def layer_names(model: str) -> list[str]:
    """Qualified module names of torchvision model ``model`` (cached after the first call)."""
    from inspect_model.output.files import safe_name

    if model.startswith("torchvision:"):
        model = model.split(":", 1)[1]
    if model not in model_names():
        return []  # user models: running their code for a completion is not cheap or safe
    cache = _cache_dir() / f"{safe_name(model)}.txt"
    if cache.exists():
        return cache.read_text().split()
    from inspect_model.loading.sources.torchvision import load_torchvision

    names = [n for n, _ in load_torchvision(model, device="meta").model.named_modules() if n]
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text("\n".join(names) + "\n")
        tmp.replace(cache)
    except OSError:
        pass
    return names


def _model_from_command_line() -> str | None:
    """During completion Click may not have parsed the MODEL argument yet (an option
    waiting for its value stops the resilient parser); read it from the words the shell
    passed: the first plain word after the subcommand."""
    import shlex

    raw = os.environ.get("COMP_WORDS") or os.environ.get("_TYPER_COMPLETE_ARGS") or ""
    try:
        words = shlex.split(raw)
    except ValueError:
        words = raw.split()
    for i, w in enumerate(words):
        if w in command_names():
            for nxt in words[i + 1:]:
                if not nxt.startswith("-"):
                    return nxt
            return None
    return None


def complete_layer(ctx: Any, incomplete: str) -> list[str]:
    model = (ctx.params or {}).get("model") if ctx is not None else None
    model = model or _model_from_command_line()
    if not model:
        return ["type:Conv2d", "type:Linear", "all"]
    try:
        names = layer_names(str(model))
    except Exception:  # completion must never crash the shell
        return []
    return [n for n in names if n.startswith(incomplete)]


def complete_method(incomplete: str, command: str = "cam") -> list[str]:
    """``command``'s ``--method`` names and groups (``all``), from its registry entry, which
    reads its method family's registry."""
    from inspect_model.registry import COMMANDS

    spec = COMMANDS.get(command)
    if spec is None or spec.methods is None:
        return []
    return [m for m in (*spec.methods(), *spec.method_groups) if m.startswith(incomplete.lower())]


def method_completer(command: str) -> Any:
    """The ``--method`` completion of one command (Typer passes only ``incomplete``)."""
    def complete(incomplete: str) -> list[str]:
        return complete_method(incomplete, command)

    return complete


def complete_target(incomplete: str) -> list[str]:
    return [t for t in ("predicted", "top:2", "top:3", "top:5") if t.startswith(incomplete)]


def complete_colormap(incomplete: str) -> list[str]:
    common = ("jet", "viridis", "magma", "inferno", "plasma", "turbo", "gray", "hot", "coolwarm", "RdBu_r",
              "seismic", "bwr")
    return [m for m in common if m.startswith(incomplete)]


def complete_device(incomplete: str) -> list[str]:
    """Devices by name; no torch import (completion must be instant), so every kind is offered.
    Not ``meta``: only ``summary`` runs there (issue 39), see :func:`complete_summary_device`."""
    return [d for d in ("cpu", "cuda", "cuda:0", "mps", "auto") if d.startswith(incomplete)]


def complete_summary_device(incomplete: str) -> list[str]:
    """``summary --device``: meta (its default) first, then the real devices."""
    return [d for d in ("meta", "cpu", "cuda", "cuda:0", "mps", "auto") if d.startswith(incomplete)]
