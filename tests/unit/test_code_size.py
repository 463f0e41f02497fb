"""Size limits on the source (issue 23, "Done when"): no module over 450 lines and no
function or method over 80 lines, so that each module keeps one concern and each function
reads on one screen. The allowlists name what is still over, each entry with its size when
listed; the goal is to empty them. Remove an entry when its split lands (a stale entry fails
the test, so that the lists only shrink)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "inspect_model"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

# Path relative to src/inspect_model -> why it may still be over.
MODULES_OVER: dict[str, str] = {

}
# "path:qualified.name" -> why it may still be over.
FUNCTIONS_OVER: dict[str, str] = {
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _key(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _function_lines(path: Path) -> dict[str, int]:
    """Qualified name (``Class.method``, ``outer.inner``) -> lines, decorators included."""
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    sizes[name] = (child.end_lineno or child.lineno) - first + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return sizes


def test_the_package_is_found() -> None:
    assert len(_modules()) > 50  # a wrong path would make every check below pass vacuously


def test_no_module_over_the_limit() -> None:
    over = {_key(p): n for p in _modules() if (n := _module_lines(p)) > MAX_MODULE_LINES}
    unexpected = {k: n for k, n in over.items() if k not in MODULES_OVER}
    assert not unexpected, (f"modules over {MAX_MODULE_LINES} lines: {unexpected}; split them by concern "
                            "(see STYLE.md) rather than adding to MODULES_OVER")


def test_no_function_over_the_limit() -> None:
    over = {f"{_key(p)}:{name}": n for p in _modules()
            for name, n in _function_lines(p).items() if n > MAX_FUNCTION_LINES}
    unexpected = {k: n for k, n in over.items() if k not in FUNCTIONS_OVER}
    assert not unexpected, (f"functions over {MAX_FUNCTION_LINES} lines: {unexpected}; split them into "
                            "named steps rather than adding to FUNCTIONS_OVER")


@pytest.mark.parametrize("key", sorted(MODULES_OVER))
def test_module_allowlist_is_not_stale(key: str) -> None:
    path = PACKAGE / key
    assert path.exists(), f"{key} no longer exists; remove it from MODULES_OVER"
    assert _module_lines(path) > MAX_MODULE_LINES, f"{key} is within the limit now; remove it from MODULES_OVER"


@pytest.mark.parametrize("key", sorted(FUNCTIONS_OVER))
def test_function_allowlist_is_not_stale(key: str) -> None:
    rel, name = key.split(":", 1)
    path = PACKAGE / rel
    sizes = _function_lines(path) if path.exists() else {}
    assert name in sizes, f"{key} no longer exists; remove it from FUNCTIONS_OVER"
    assert sizes[name] > MAX_FUNCTION_LINES, f"{key} is within the limit now; remove it from FUNCTIONS_OVER"
