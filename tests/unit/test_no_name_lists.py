"""Issue 35, "Done when": no list of command or method names outside the registries. Every
tuple, list or set literal of two or more such names in the package is a property missing
from a registry entry (``CommandSpec``, ``CamMethod``, ``AttributionMethod``, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "inspect_model"
# Where names are declared: the registries themselves (an entry per module).
REGISTRIES = ("registry.py", "methods/cam/base.py", "methods/attributions/base.py", "methods/attention/base.py")


def _names() -> set[str]:
    from inspect_model import registry
    from inspect_model.methods.attention import base as attention
    from inspect_model.methods.attributions import base as attributions
    from inspect_model.methods.cam import base as cam

    return {*registry.names(), *cam.names(), *attributions.names(), *attention.names()}


def _lists(path: Path, names: set[str], root: Path = PACKAGE) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List, ast.Set)):
            named = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.endswith(("_COMMANDS", "_METHODS"))]
            if named and any(isinstance(e, ast.Constant) and e.value in names for e in node.value.elts):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {named[0]}")
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            hits = [v for v in items if v in names]
            if len(hits) >= 2 and len(hits) == len(node.elts):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {hits}")
    return found


def test_no_list_of_command_or_method_names_outside_the_registries() -> None:
    names = _names()
    assert {"cam", "gradcam", "saliency", "rollout"} <= names  # the registries are read
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).as_posix() not in REGISTRIES
             and "variants" not in p.parts for hit in _lists(p, names)]
    assert not found, "name lists outside the registries (make them a property of the entries):\n" + "\n".join(found)


def test_the_check_finds_a_list(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_text('GRADIENT_COMMANDS = ("grads", "cam")\nOK = ("grads", "other")\nif c in ["cam", "grads"]: pass\n'
                 'PARAMETER_COMMANDS = ("grads",)\n')
    assert sorted(_lists(p, {"grads", "cam"}, tmp_path)) == ["x.py:1: GRADIENT_COMMANDS", "x.py:1: ['grads', 'cam']",
                                                             "x.py:3: ['cam', 'grads']", "x.py:4: PARAMETER_COMMANDS"]
