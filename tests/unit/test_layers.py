"""The dependency rule (issue 12): cli -> api -> {render, methods} -> engine -> loading ->
errors (with devices.py beside errors), only cli/ imports typer, engine/ imports only errors,
devices and torch. import-linter holds it (contracts in pyproject.toml), on every CI run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_import_linter_contracts_are_kept() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(exe), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]
    assert "BROKEN" not in r.stdout and "3 kept, 0 broken" in r.stdout


def test_help_imports_neither_torch_nor_the_api_modules() -> None:
    code = ("import sys; from inspect_model.cli.app import app; "
            "print(sorted(m for m in ('torch', 'torchvision', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
