"""Issue 35, "Done when": the house reads from its file list. ``methods/`` has no file-name
prefix families (``cam_*``, ``attention_*``: those are subpackages), and ``api/`` holds only
commands: every module or package directly in it registers one (``@command``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "inspect_model"


def _entries(folder: Path) -> tuple[list[str], list[str]]:
    """(modules, subpackages) directly in ``folder``."""
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    packages = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    return modules, packages


def test_methods_has_no_prefix_families() -> None:
    modules, packages = _entries(PACKAGE / "methods")
    assert {"cam", "attention", "attributions", "gradients", "faithfulness", "objectives"} <= set(packages)
    heads = Counter(m.split("_")[0] for m in modules)
    families = {h: n for h, n in heads.items() if n > 1}
    assert not families, f"methods/ modules sharing a prefix (make a subpackage): {families}"
    beside = [m for m in modules if m.split("_")[0] in packages or m.split("_")[0].rstrip("s") in packages]
    assert not beside, f"methods/ modules named after a subpackage (move them into it): {beside}"


def test_api_holds_only_commands() -> None:
    from inspect_model import registry

    modules, packages = _entries(PACKAGE / "api")
    registered = {s.api.__module__.removeprefix("inspect_model.api.").split(".")[0]
                  for s in registry.COMMANDS.values() if s.api.__module__.startswith("inspect_model.api.")}
    assert set(modules) | set(packages) == registered
