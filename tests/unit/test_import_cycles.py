"""No package of inspect_model imports itself in a circle (issue 23): within each package
(api/, loading/, render/, ...), the graph of its modules' imports, lazy ones inside functions
included and ``if TYPE_CHECKING:`` blocks excluded, has no cycle. Read from the source (AST),
so a circle hidden in a function body counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "inspect_model"
PACKAGES = sorted(p.parent for p in SRC.rglob("__init__.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports (absolute names), skipping ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import module` imports the module (pkg's __init__ runs first: counted
            # when nothing else is named); `from pkg.mod import name` imports pkg.mod.
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
            found.add(f"?{base}")  # resolved in _graph against the package's modules
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph(package: Path) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in package.glob("*.py")}
    graph = {}
    for name, path in files.items():
        found = _imports(path, name)
        bases = {m[1:] for m in found if m.startswith("?")}
        # `from inspect_model.api import resume` depends on run/resume.py, not on every module api/__init__ names
        only_submodules = {b for b in bases if any(m.startswith(b + ".") and m in files for m in found)}
        graph[name] = {m for m in found if m in files and m != name and m not in only_submodules}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


# Circles another part of issue 23 removes (item 4: one module per model source); drop the
# entry when it lands.
KNOWN: dict[str, str] = {}  # none left: loading/ is one module per source (issue 23 item 4)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: _module_name(p / "__init__.py"))
def test_no_import_cycle_inside_a_package(package: Path) -> None:
    name = _module_name(package / "__init__.py")
    cycle = _cycle(_graph(package))
    if cycle is not None and name in KNOWN:
        pytest.xfail(f"known circle: {KNOWN[name]}")
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
