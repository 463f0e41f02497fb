"""Shell completion, driven the way bash, zsh and fish drive it: the ``_INSPECT_MODEL_COMPLETE``
environment protocol, in a fresh process (issue 29: completion printed an error on every Tab)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import inspect_model.cli.completion as completion


def _complete(shell: str, words: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Ask for completions of the last word of ``words`` as ``shell`` would."""
    env = {**os.environ, "_INSPECT_MODEL_COMPLETE": f"complete_{shell}", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "HOME": str(tmp_path)}
    if shell == "bash":
        env["COMP_WORDS"] = words
        env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    else:
        env["_TYPER_COMPLETE_ARGS"] = words
        if shell == "fish":
            env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    return subprocess.run([sys.executable, "-m", "inspect_model"], capture_output=True, text=True, env=env,
                          timeout=120)


def _words(shell: str, out: str) -> set[str]:
    """The candidate words in one shell's completion output."""
    if shell == "zsh":  # _arguments '*: :(("a" "b"))' or "a":"help" lines
        import re

        return set(re.findall(r'"([^"]+?)"', out))
    return {ln.split("\t")[0] for ln in out.splitlines() if ln.strip()}


@pytest.mark.parametrize("shell, words, expected", [
    *[(sh, "inspect-model summary resnet1", {"resnet18", "resnet101", "resnet152"}) for sh in ("bash", "zsh", "fish")],
    *[(sh, "inspect-model cam resnet18 -m grad", {"gradcam", "gradcam++", "gradients"}) for sh in ("bash", "zsh",
                                                                                                   "fish")],
    ("bash", "inspect-model cam resnet18 --method score", {"scorecam"}),
    ("fish", "inspect-model grads resnet18 --device cu", {"cuda", "cuda:0"}),
    ("bash", "inspect-model cam resnet18 --target to", {"top:2", "top:3", "top:5"}),
    ("zsh", "inspect-model gui", {"guided-backprop"}),
])
def test_completion_answers_without_errors(shell: str, words: str, expected: set[str], tmp_path: Path) -> None:
    r = _complete(shell, words, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert expected <= _words(shell, r.stdout), r.stdout


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("command, option", [("cam", "-l"), ("activations", "--layers"), ("guided-backprop", "--layer")])
def test_layer_names_complete_in_every_command(command: str, option: str, tmp_path: Path) -> None:
    r = _complete("bash", f"inspect-model {command} resnet18 {option} layer4.", tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert {"layer4.0", "layer4.1", "layer4.1.conv2"} <= set(r.stdout.split()), r.stdout
    # cached: a second completion reads the names from disk
    assert (tmp_path / "cache" / "inspect-model" / "layers" / "resnet18.txt").exists()


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_show_completion_prints_the_script_and_exits_0(shell: str, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "inspect_model", "--show-completion", shell], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "_INSPECT_MODEL_COMPLETE" in r.stdout and "error" not in r.stderr


def test_install_completion_writes_the_shell_file_and_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "inspect_model", "--install-completion", "bash"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "_INSPECT_MODEL_COMPLETE" in (tmp_path / ".bash_completions" / "inspect-model.sh").read_text()


def test_a_model_calling_sys_exit_is_still_an_error(cli, tmp_path: Path) -> None:
    """The completion fix lets Click's own exits through, not the model's."""
    p = tmp_path / "exits.py"
    p.write_text("import sys\n\ndef build():\n    sys.exit(0)\n")
    r = cli(["summary", f"{p}:build", "--input-size", "3x8x8"])
    assert r.exit_code == 6 and "sys.exit(0)" in r.stderr


def test_completers_need_no_torch() -> None:
    code = ("import sys; import inspect_model.cli.completion as c; "
            "c.complete_method('grad'); c.complete_device('c'); c.complete_model('res'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    assert "gradcam" in completion.complete_method("grad")
