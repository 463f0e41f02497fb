"""The CLI edge: help without torch, completion, version, exit codes listed in help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inspect_model.cli.app import COMMANDS
from inspect_model.errors import EXIT_CODES

NO_TORCH = (
    "import sys, runpy\n"
    "sys.argv = ['inspect-model'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module('inspect_model', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "heavy = [m for m in ('torch', 'torchvision', 'matplotlib', 'numpy') if m in sys.modules]\n"
    "print('HEAVY=' + ','.join(heavy))\n"
)


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_does_not_import_torch(command: str | None) -> None:
    args = ["--help"] if command is None else [command, "--help"]
    r = _run(args)
    assert r.stdout.strip().endswith("HEAVY="), r.stdout[-300:] + r.stderr
    assert "Usage:" in r.stdout


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "models"])
def test_every_subcommand_help_shows_an_example(command: str) -> None:
    r = _run([command, "--help"])
    assert f"Example: inspect-model {command}" in " ".join(r.stdout.split())


def test_argument_errors_do_not_import_torch() -> None:
    r = _run(["summary", "--no-such-option"])
    assert "HEAVY=\n" in r.stdout + "\n" and "error:" in r.stderr


def test_top_level_help_documents_exit_codes(cli) -> None:
    r = cli(["--help"])
    for code, text in EXIT_CODES.items():
        assert f"{code}: {text}" in " ".join(r.stdout.split())


def test_version_and_python_m(cli) -> None:
    r = cli(["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("inspect-model ")
    p = subprocess.run([sys.executable, "-m", "inspect_model", "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("inspect-model ")


def test_model_name_completion_without_torch(tmp_path: Path) -> None:
    r = _run([], env={"_INSPECT_MODEL_COMPLETE": "complete_bash", "COMP_WORDS": "inspect-model summary resnet3",
                      "COMP_CWORD": "2"})
    assert "resnet34" in r.stdout.split() and "HEAVY=" in r.stdout
    assert r.stdout.strip().endswith("HEAVY=")


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_layer_name_completion_is_cached(tmp_path: Path) -> None:
    env = {"_INSPECT_MODEL_COMPLETE": "complete_bash", "COMP_WORDS": "inspect-model grads resnet18 --layers layer4.1.c",
           "COMP_CWORD": "4", "XDG_CACHE_HOME": str(tmp_path)}
    r = _run([], env=env)
    assert {"layer4.1.conv1", "layer4.1.conv2"} <= set(r.stdout.split())
    assert (tmp_path / "inspect-model" / "layers" / "resnet18.txt").exists()
    r = _run([], env=env)  # second time from the cache: torch not imported
    assert {"layer4.1.conv1", "layer4.1.conv2"} <= set(r.stdout.split()) and r.stdout.strip().endswith("HEAVY=")


def test_shipped_model_list_matches_torchvision_registry() -> None:
    from inspect_model.cli.completion import model_names
    from inspect_model.loading.sources.torchvision import registry

    assert set(model_names()) == set(registry())


def test_unexpected_exception_is_one_line_and_debug_shows_traceback(cli, monkeypatch) -> None:
    from inspect_model import api

    def broken(*a, **k):
        raise KeyError("internal")

    monkeypatch.setattr(api, "summary", broken)
    r = cli(["summary", "resnet18"])
    assert r.exit_code == 6
    assert r.stderr.strip().splitlines() == [
        "error: unexpected KeyError: 'internal' (run with --debug for a traceback)"
    ]
    r = cli(["summary", "resnet18", "--debug"])
    assert "Traceback" in r.stderr and r.stderr.strip().splitlines()[-1].startswith("error: unexpected KeyError")


def test_every_option_has_help_text() -> None:
    import typer

    from inspect_model.cli.app import app

    group = typer.main.get_command(app)
    missing = []
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        for p in cmd.params:
            if p.param_type_name == "option" and not (getattr(p, "help", None) or "").strip():
                missing.append(f"{name} {p.opts[0]}")
    assert not missing, missing


def test_tensorboard_without_the_extra_is_a_clear_usage_error(cli, models_py, tmp_path, monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    r = cli(["activations", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--weights", "none",
             "--tensorboard", str(tmp_path / "tb")])
    assert r.exit_code == 2
    assert r.stderr.strip() == ("error: --tensorboard needs the tensorboard package; "
                                "pip install 'inspect-model[tensorboard]'")


# ----------------------------------------------------------------- top-level --help (issue 29.8)
def test_top_level_help_lists_exit_codes_one_a_line_and_whole_summaries(cli) -> None:
    from inspect_model import errors

    res = cli(["--help"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    start = lines.index("  Exit codes:")
    block = lines[start + 2:start + 2 + len(errors.EXIT_CODES)]
    assert [ln.split(None, 1)[0] for ln in block] == [f"{c}:" for c in errors.EXIT_CODES]  # no blank lines between
    assert all(ln.split(None, 1)[1] == errors.EXIT_CODES[int(ln.split(None, 1)[0][:-1])] for ln in block)
    from inspect_model import registry

    commands = " ".join(" ".join(lines[lines.index("Commands:") + 1:]).split())
    for spec in registry.COMMANDS.values():  # whole, never cut at "et al." (Click's first-sentence rule)
        assert f"{spec.name} {spec.summary}" in commands, spec.name
    assert "(Springenberg et al. 2015) for any ReLU network" in commands
