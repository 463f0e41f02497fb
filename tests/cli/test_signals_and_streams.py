"""Exit codes and signals (issue 41): SIGHUP unwinds a run like SIGTERM (no staging folder
left); a reader that leaves stdout (``--jsonl | head -c 20``) is exit 0 with nothing on
stderr and the files complete; a model nested 3,000 modules deep gets a one-line message;
control characters from ``--text`` are escaped in report.html; both phrasings of the CPU
allocator's failure are out of memory (exit 6, with the size)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.processes import FAULTY, SMALL, image_folder, run_each, wait_for
from fixtures.processes import env as _env
from fixtures.invariants import register_model
from inspect_model import errors

COMMON = [*SMALL, "-q"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    imgs, spec = image_folder(tmp_path_factory.mktemp("signals"), 6, seed=5)
    return {"imgs": imgs, "spec": Path(spec)}


def _stalled(data: dict[str, Path], tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "out"
    args = ["cam", str(data["spec"]), str(data["imgs"]), *COMMON, "-o", str(out), *extra]
    proc = subprocess.Popen([*FAULTY, "stall:2", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(READY_DIR=str(tmp_path)))
    wait_for(proc, tmp_path / "ready-0", 240)
    return proc, out


# ------------------------------------------------------------------ SIGHUP
@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_the_issue_example_sighup_mid_run_leaves_no_staging_folder(data: dict[str, Path], tmp_path: Path) -> None:
    proc, out = _stalled(data, tmp_path)
    proc.send_signal(signal.SIGHUP)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == errors.EXIT_HANGUP == 129, err
    lines = err.strip().splitlines()
    assert lines == ["error: hung up (SIGHUP); partial outputs removed"], err
    assert stdout == "" and not out.exists()


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_sighup_under_resume_keeps_the_state_like_sigterm(data: dict[str, Path], tmp_path: Path) -> None:
    proc, out = _stalled(data, tmp_path, "--resume")
    proc.send_signal(signal.SIGHUP)
    _stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 129, err
    assert [p.name for p in out.iterdir()] == [".inspect-model-staging-resume"]


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_an_ignored_sighup_stays_ignored_under_nohup(data: dict[str, Path], tmp_path: Path) -> None:
    """``nohup inspect-model ...`` must outlive the terminal: the CLI keeps SIGHUP ignored."""
    code = ("import signal, sys, runpy\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "sys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    out = tmp_path / "out"
    args = ["cam", str(data["spec"]), str(data["imgs"]), *COMMON, "-o", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", code, FAULTY[1], "stall:2", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(READY_DIR=str(tmp_path)))
    wait_for(proc, tmp_path / "ready-0", 240)
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert proc.poll() is None  # still running
    proc.send_signal(signal.SIGTERM)
    _stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err


def test_sighup_while_importing_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "inspect_model", "summary", "resnet18", "--weights", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    time.sleep(0.3)
    proc.send_signal(signal.SIGHUP)
    _out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # it finished first: nothing to say
        return
    assert proc.returncode == 129, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: hung up (SIGHUP)"), err


# ------------------------------------------------------------------ a reader that leaves
FORMATS = ["--jsonl", "--json", "text"]


@pytest.fixture(scope="module")
def readers(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """fmt -> (exit status, stderr, output dir) of ``inspect-model activations ... | head -c 20``
    (faulty_run.py ``head:20``): every format in one ``--each`` (torch and the CLI imported
    once, a forked child per run)."""
    root = tmp_path_factory.mktemp("readers")
    outs = [root / f"out{i}" for i in range(len(FORMATS))]
    runs = [["head:20", "activations", str(data["spec"]), str(data["imgs"]), *COMMON,
             *([] if fmt == "text" else [fmt]), "-o", str(out)] for fmt, out in zip(FORMATS, outs, strict=True)]
    return {case: (code, err, out) for case, (code, err), out in zip(FORMATS, run_each(runs, root), outs, strict=True)}


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_issue_example_a_reader_leaving_is_exit_0_with_nothing_on_stderr(
        fmt: str, readers: dict[str, tuple[int, str, Path]]) -> None:
    code, err, out = readers[fmt]
    assert code == 0, err
    assert err == ""
    report = json.loads((out / "report.json").read_text())
    assert report["image_count"] == 6  # nothing lost: the run finished its files


# ------------------------------------------------------------------ deep models
class Deep(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.inner = Deep(depth - 1) if depth > 1 else nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _deep(depth: int) -> nn.Module:
    top = cur = Deep(1)
    for _ in range(depth - 1):  # built iteratively: the recursive constructor would overflow too
        nxt = Deep(1)
        cur.inner = nxt
        cur = nxt
    return top


@pytest.mark.parametrize("command", ["summary", "activations", "grads", "cam"])
def test_the_issue_example_a_model_3000_deep_is_one_line(command: str, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, _deep(3000))
    r = cli([command, spec, "--input-size", "4", "-q"])
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert r.exit_code == 6 and len(lines) == 1, r.stderr
    assert "nests modules more than 200 deep" in lines[0] and "unexpected" not in lines[0], lines[0]


def test_a_model_within_the_depth_limit_runs(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, _deep(150))
    r = cli(["activations", spec, "--input-size", "4", "-q", "--json"])
    assert r.exit_code == 0, r.stderr


def test_a_recursion_error_anywhere_is_one_line_not_unexpected(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    class Recurses(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            def down(n: int) -> int:
                return down(n + 1)

            down(0)
            return self.fc(x)

    spec = register_model(monkeypatch, Recurses())
    r = cli(["grads", spec, "--input-size", "4", "-q"])
    assert r.exit_code == 6, r.stderr
    assert "unexpected" not in r.stderr and "recursion" in r.stderr.lower(), r.stderr


# ------------------------------------------------------------------ report.html
def test_the_issue_example_control_characters_from_text_are_escaped_in_report_html(tmp_path: Path, cli) -> None:
    pytest.importorskip("transformers")
    from fixtures.text_models import save_text_model

    model = save_text_model("bert", tmp_path / "bert")
    out = tmp_path / "out"
    text = "the cat\x1b[31m sat\x07 on\x00 the\x08 mat\u202e"
    r = cli(["attention", str(model), "--weights", "default", "--text", text, "-o", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    raw = re.findall(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u202e]", page)
    assert raw == [], raw
    assert "\\x1b" in page and "\\x07" in page  # shown as report.txt shows them


# ------------------------------------------------------------------ out of memory
class _Allocates(nn.Module):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.exc = exc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.exc


PHRASINGS = {
    "can't allocate": "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you "
                      "tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)",
    "not enough memory": "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried "
                         "to allocate 34359738368 bytes.",
    "without the allocator's name": "can't allocate memory: you tried to allocate 34359738368 bytes",
}


@pytest.mark.parametrize("phrasing", list(PHRASINGS))
@pytest.mark.parametrize("command", ["summary", "activations", "cam"])
def test_the_issue_example_both_allocator_phrasings_are_out_of_memory(phrasing: str, command: str,
                                                                      monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, _Allocates(RuntimeError(PHRASINGS[phrasing])))
    r = cli([command, spec, "--input-size", "4", "-q"])
    assert r.exit_code == 6, r.stderr
    assert "out of CPU memory (an allocation of 32.0 GiB failed)" in r.stderr, r.stderr
    assert "does not fit" not in r.stderr


def test_a_real_mismatch_is_still_exit_4() -> None:
    assert errors.out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (1x3 and 4x2)")) is None
    assert errors.out_of_memory(RuntimeError("you tried to allocate 5 bytes but the shape is wrong")) is None
