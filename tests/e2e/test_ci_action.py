"""CI in one line (issue 39): the GitHub Action's steps (action.yml -> action/steps.sh) run as a
script, its install step is CPU-only, the job fails on exit 1; the pre-commit hook runs
`check` on changed model files through `pre-commit try-repo` (slow tier)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
NET = '''
from torch import nn


def build():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 5))
'''


def _step(step_id: str) -> dict:
    return next(s for s in ACTION["runs"]["steps"] if s.get("id") == step_id)


def _expand(text: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """GitHub's ${{ ... }} expressions for the few the action uses."""
    def value(m: re.Match[str]) -> str:
        expr = m.group(1).strip()
        if expr == "github.action_path":
            return str(ROOT)
        if expr.startswith("inputs."):
            return inputs[expr.removeprefix("inputs.")]
        if expr.startswith("steps.run.outputs."):
            return outputs.get(expr.removeprefix("steps.run.outputs."), "")
        raise AssertionError(f"unexpected expression {expr}")
    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def _run_step(step_id: str, inputs: dict[str, str], outputs: dict[str, str], cwd: Path,
              extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one `run:` step of the composite action as the runner would: its env, bash, the workspace."""
    step = _step(step_id)
    assert step["shell"] == "bash"
    gh_out = cwd / f"github_output_{step_id}"
    gh_out.write_text("")
    env = {**os.environ, **{k: _expand(str(v), inputs, outputs) for k, v in step.get("env", {}).items()},
           "GITHUB_OUTPUT": str(gh_out), **(extra_env or {})}
    proc = subprocess.run(["bash", "-c", _expand(step["run"], inputs, outputs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    for line in gh_out.read_text().splitlines():
        k, _, v = line.partition("=")
        outputs[k] = v
    return proc


def _inputs(**given: str) -> dict[str, str]:
    defaults = {k: str(v.get("default", "")) for k, v in ACTION["inputs"].items()}
    return {**defaults, **given}


def test_action_is_composite_and_uploads_the_output_dir() -> None:
    steps = ACTION["runs"]["steps"]
    assert ACTION["runs"]["using"] == "composite"
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "${{ inputs.output-dir }}" and "always()" in upload["if"]
    ids = [s.get("id") for s in steps]
    assert ids.index("run") < steps.index(upload) < ids.index("verdict")  # upload before the verdict fails the job
    assert ACTION["inputs"]["command"]["default"] == "check"


@pytest.mark.parametrize("shape, code", [("1x5", "0"), ("1x6", "1")])
def test_action_steps_run_check_with_a_config(tmp_path: Path, shape: str, code: str) -> None:
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "ci.toml").write_text(f'[check]\ninput-size = ["3x16x16"]\nexpect-output-shape = "{shape}"\n')
    inputs = _inputs(model="net.py:build", config="ci.toml", args="--max-seconds 60")
    outputs: dict[str, str] = {}
    run = _run_step("run", inputs, outputs, tmp_path)
    assert run.returncode == 0, run.stderr  # the step itself passes, so the upload runs
    assert outputs["exit-code"] == code
    assert "+ inspect-model check net.py:build --config ci.toml -o inspect-model-output --max-seconds 60" in run.stderr
    out = tmp_path / "inspect-model-output"
    assert (out / "report.json").exists() and (out / "report.txt").exists()  # what the artifact uploads
    verdict = _run_step("verdict", inputs, outputs, tmp_path)
    assert verdict.returncode == int(code)  # exit 1 fails the job
    if code == "1":
        assert "::error title=inspect-model check::exit 1" in run.stdout


def test_action_any_command_and_quoted_args(tmp_path: Path) -> None:
    (tmp_path / "my net.py").write_text(NET)
    inputs = _inputs(model="my net.py:build", command="summary", output_dir="", args="--input-size '3x8x8' --json")
    inputs["output-dir"] = ""
    outputs: dict[str, str] = {}
    run = _run_step("run", inputs, outputs, tmp_path)
    assert run.returncode == 0 and outputs["exit-code"] == "0", run.stderr
    assert '"total_params"' in run.stdout and not (tmp_path / "inspect-model-output").exists()


def test_action_verdict_fails_when_the_tool_did_not_run(tmp_path: Path) -> None:
    assert _run_step("verdict", _inputs(), {}, tmp_path).returncode == 1


def test_action_install_step_is_cpu_only(tmp_path: Path) -> None:
    """The install step with a stand-in `python` that records its arguments (no download here)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    log = tmp_path / "pip.log"
    (shim / "python").write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n')
    (shim / "python").chmod(0o755)
    proc = _run_step("install", _inputs(extras="timm"), {}, tmp_path,
                     {"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    assert lines[0].endswith("torch torchvision --index-url https://download.pytorch.org/whl/cpu")
    assert lines[1].endswith(f"{ROOT}[timm]")  # the action's own checkout is the package


def test_pre_commit_hook_module_loops_over_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_model.cli import precommit

    calls: list[list[str]] = []

    def fake(cmd: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, {"a.py:build": 0, "b.py:build": 1, "c.py:build": 3}[cmd[4]])

    monkeypatch.setattr(precommit.subprocess, "run", fake)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".inspect-model.toml").write_text("")
    assert precommit.main(["a.py"]) == 0
    assert calls[-1] == [sys.executable, "-m", "inspect_model", "check", "a.py:build", "--config", ".inspect-model.toml"]
    assert precommit.main(["a.py", "c.py", "b.py"]) == 1  # a failed check wins over a load error
    assert precommit.main(["a.py", "c.py", "--config", "x.toml", "--max-seconds", "9"]) == 3
    assert calls[-1][-4:] == ["--max-seconds", "9", "--config", "x.toml"]


@pytest.mark.slow
def test_pre_commit_try_repo_runs_check_on_changed_model_files(tmp_path: Path) -> None:
    exe = shutil.which("pre-commit")
    if exe is None:
        pytest.skip("pre-commit is not installed (pip install -e '.[test]')")
    repo = tmp_path / "project"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "net.py").write_text(NET)
    (repo / ".inspect-model.toml").write_text('[check]\ninput-size = ["3x16x16"]\nexpect-output-shape = "1x5"\n')
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=repo, check=True, env=env)

    def try_repo() -> subprocess.CompletedProcess[str]:
        # language: system: the hook runs the inspect-model of this environment, nothing installed
        return subprocess.run([exe, "try-repo", str(ROOT), "inspect-model-check-system", "--files", "models/net.py"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=600)

    ok = try_repo()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"inspect-model check \(installed tool\)\.+Passed", ok.stdout), ok.stdout
    (repo / ".inspect-model.toml").write_text('[check]\ninput-size = ["3x16x16"]\nexpect-output-shape = "1x6"\n')
    bad = try_repo()
    assert bad.returncode == 1 and "Failed" in bad.stdout and "FAIL" in bad.stdout, bad.stdout
