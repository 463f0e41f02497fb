"""Hostile files and faults around a run (issue 28): a tampered ``--resume`` state, signals
while the CLI starts, out of memory, bad environment values, a file-size limit, threads the
model leaves running. Each is one line on stderr, its exit code, and nothing moved or left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fixtures.processes import FAULTY, SMALL, image_folder, run_each, wait_for
from fixtures.processes import env as _env
from fixtures.processes import one_line as _one_line
from fixtures.invariants import register_model
from fixtures.models import TinyCNN

COMMON = [*SMALL, "--json", "-q"]
STAGING = ".inspect-model-staging-resume"


# ------------------------------------------------------------------ a tampered resume state
@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A cam --resume run killed after 2 of 5 images: its output directory holds a state."""
    root = tmp_path_factory.mktemp("tampered")
    imgs, spec = image_folder(root, 5, seed=2)
    out = root / "out"
    args = ["cam", spec, str(imgs), *COMMON, "-o", str(out), "--resume"]
    r = subprocess.run([*FAULTY, "kill:2", *args], capture_output=True, text=True, env=_env(), timeout=300,
                       check=False)
    assert r.returncode == -9, r.stderr
    assert (out / STAGING / "state-0.pt").is_file()
    return {"root": root, "out": out, "args": args}


def _load(path: Path) -> dict[str, Any]:
    import inspect_model.methods.cam.maps  # noqa: F401 - its record classes: the only globals a state may name
    from inspect_model.run.resume import load_state

    return load_state(path)


def _save(path: Path, state: dict[str, Any]) -> None:
    from inspect_model.run.resume import save_state

    save_state(path, state)


def _tamper_pending(state: dict[str, Any], out: Path, home: Path, case: str) -> None:
    staging = out / STAGING
    staged, _ = state["pending"][0]
    if case == "final outside":  # the next commit would overwrite ~/.bashrc
        state["pending"].append((staged, str(home / ".bashrc")))
    elif case == "final outside by ..":
        state["pending"].append((staged, str(out / ".." / "home" / ".bashrc")))
    elif case == "staged outside":  # the next commit would pull a file of the user's into the directory
        state["pending"].append((str(home / "secret"), str(out / "secret")))
    elif case == "final through a symlink":
        (out / "link").symlink_to(home, target_is_directory=True)
        state["pending"].append((staged, str(out / "link" / ".bashrc")))
    elif case == "staged is a symlink":
        (staging / "evil.png").symlink_to(home / "secret")
        state["pending"].append((str(staging / "evil.png"), str(out / "evil.png")))
    elif case == "final in a staging folder":
        state["pending"].append((staged, str(out / ".inspect-model-staging-x" / "f.png")))
    elif case == "written outside":
        state["written"].append(str(home / ".bashrc"))
    elif case == "done out of range":
        state["done"] = 99
    elif case == "done not a number":
        state["done"] = "2"
    elif case == "pending not pairs":
        state["pending"] = [[staged]]
    elif case == "session state damaged":
        state["session"]["entries"] = 5
    else:  # pragma: no cover
        raise AssertionError(case)


CASES = ["final outside", "final outside by ..", "staged outside", "final through a symlink", "staged is a symlink",
         "final in a staging folder", "written outside", "done out of range", "done not a number",
         "pending not pairs", "session state damaged"]


@pytest.mark.parametrize("case", CASES)
def test_a_tampered_resume_state_is_refused_and_nothing_moves(case: str, killed: dict[str, Any],
                                                              tmp_path: Path, cli) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine\n")
    (home / "secret").write_text("secret\n")
    out = tmp_path / "out"
    shutil.copytree(killed["out"], out, symlinks=True)
    state_path = out / STAGING / "state-0.pt"
    state = _load(state_path)
    # The state names the killed run's directory: point it at this copy, as a planted one would.
    old = str(killed["out"])
    state["pending"] = [(a.replace(old, str(out)), b.replace(old, str(out))) for a, b in state["pending"]]
    state["written"] = [w.replace(old, str(out)) for w in state["written"]]
    _tamper_pending(state, out, home, case)
    _save(state_path, state)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    # A symlink planted in the directory makes it non-empty: the run must be forced past that.
    args = [*killed["args"][:-3], "-o", str(out), "--resume", *(["--force"] if "symlink" in case else [])]
    r = cli(args)
    assert r.exit_code == 7, r.stderr
    line = _one_line(r.stderr)
    assert "resume state" in line and "remove" in line, line
    assert r.stdout == ""
    assert (home / ".bashrc").read_text() == "mine\n" and (home / "secret").read_text() == "secret\n"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # nothing moved


def test_the_untampered_copy_resumes(killed: dict[str, Any], tmp_path: Path, cli) -> None:
    """The same copy, its paths only moved to the copy: resumes (the refusals above are the tampering's)."""
    out = tmp_path / "out"
    shutil.copytree(killed["out"], out, symlinks=True)
    state_path = out / STAGING / "state-0.pt"
    state = _load(state_path)
    old = str(killed["out"])
    state["pending"] = [(a.replace(old, str(out)), b.replace(old, str(out))) for a, b in state["pending"]]
    state["written"] = [w.replace(old, str(out)) for w in state["written"]]
    _save(state_path, state)
    r = cli([*killed["args"][:-3], "-o", str(out), "--resume"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["image_count"] == 5


def test_a_symlinked_staging_folder_is_refused(killed: dict[str, Any], tmp_path: Path, cli) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / STAGING).symlink_to(elsewhere, target_is_directory=True)
    r = cli([*killed["args"][:-3], "-o", str(out), "--resume"])
    assert r.exit_code == 7, r.stderr
    _one_line(r.stderr)
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------------------------ signals while starting
_SLOW_TYPER = """
import os, time
open(os.environ["READY_FILE"], "w").close()
time.sleep(60)
"""


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                    (signal.SIGTERM, 143, "terminated")], ids=["INT", "TERM"])
def test_a_signal_while_importing_is_one_line(sig: int, code: int, word: str, tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM while the CLI still imports (typer here, made slow): one line, no traceback."""
    shim = tmp_path / "shim" / "typer"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_SLOW_TYPER)
    ready = tmp_path / "ready"
    env = _env(READY_FILE=str(ready))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shim"), env["PYTHONPATH"]])
    proc = subprocess.Popen([sys.executable, "-m", "inspect_model", "summary", "resnet18"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    wait_for(proc, ready, 60, poll=0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert word in _one_line(err) and out == ""


# ------------------------------------------------------------------ out of memory
class _Allocates(nn.Module):
    """Its first layer's allocation fails as torch's allocators fail."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.exc = exc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.exc


OOMS = {
    "cpu": (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                         "you tried to allocate 34359738368 bytes."), "out of CPU memory (an allocation of 32.0 GiB"),
    "cuda": (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                         "capacity of 79.1 GiB"), "out of GPU memory (an allocation of 2.00 GiB"),
    "python": (MemoryError(), "out of CPU memory;"),
}


@pytest.mark.parametrize("kind", list(OOMS))
@pytest.mark.parametrize("command", ["summary", "activations", "grads", "cam"])
def test_out_of_memory_is_exit_6_and_says_how_much(kind: str, command: str, monkeypatch: pytest.MonkeyPatch,
                                                   cli) -> None:
    exc, text = OOMS[kind]
    spec = register_model(monkeypatch, _Allocates(exc))
    r = cli([command, spec, "--input-size", "4", "-q"])
    assert r.exit_code == 6, r.stderr
    line = _one_line(r.stderr)
    assert text in line and "--batch-size" in line, line


def test_a_real_runtime_error_in_the_first_layer_is_still_an_input_error(monkeypatch: pytest.MonkeyPatch,
                                                                         cli) -> None:
    spec = register_model(monkeypatch, TinyCNN())
    r = cli(["activations", spec, "--input-size", "5x8x8", "-q"])
    assert r.exit_code == 4, r.stderr


# ------------------------------------------------------------------ environment variables
@pytest.mark.parametrize(("name", "value"), [
    ("INSPECT_MODEL_CHECKPOINT_SECONDS", "abc"), ("INSPECT_MODEL_CHECKPOINT_SECONDS", "-1"),
    ("INSPECT_MODEL_CHECKPOINT_SECONDS", "nan"), ("INSPECT_MODEL_RENDER_THREADS", "two"),
    ("INSPECT_MODEL_RENDER_THREADS", "-2"), ("INSPECT_MODEL_DIST_TIMEOUT", "0"),
    ("INSPECT_MODEL_DIST_TIMEOUT", "1e999"), ("INSPECT_MODEL_DIST_BACKEND", "mpi"),
    ("INSPECT_MODEL_OFFLINE", "maybe"), ("RANK", "first"),
])
def test_a_bad_environment_value_is_a_usage_error(name: str, value: str, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, cli) -> None:
    monkeypatch.setenv(name, value)
    if name == "RANK":
        monkeypatch.setenv("WORLD_SIZE", "2")
    spec = register_model(monkeypatch, TinyCNN())
    out = tmp_path / "out"
    r = cli(["cam", spec, "--input-size", "3x8x8", "-o", str(out), "--resume"])
    assert r.exit_code == 2, r.stderr
    line = _one_line(r.stderr)
    assert name in line and repr(value)[1:-1] in line, line
    assert not out.exists()


def test_good_environment_values_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_model.settings import check_environment, env_flag

    for name, value in (("INSPECT_MODEL_CHECKPOINT_SECONDS", "2.5"), ("INSPECT_MODEL_RENDER_THREADS", "0"),
                        ("INSPECT_MODEL_DIST_TIMEOUT", "60"), ("INSPECT_MODEL_DIST_BACKEND", "GLOO"),
                        ("INSPECT_MODEL_OFFLINE", "yes")):
        monkeypatch.setenv(name, value)
    check_environment()
    assert env_flag("INSPECT_MODEL_OFFLINE")


# ------------------------------------------------------------------ a file-size limit
LIMITS = [(limit, resume) for limit in (3000, 12000) for resume in (True, False)]


@pytest.fixture(scope="module")
def limited(killed: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, bool], Any]:
    """(limit, resume) -> (exit status, stderr, output dir) of the killed run's command line
    under RLIMIT_FSIZE: every case in one faulty_run.py ``--each`` (torch and the CLI imported
    once, a forked child per run)."""
    pytest.importorskip("resource")
    root = tmp_path_factory.mktemp("limited")
    outs = [root / f"{limit}-{resume}" / "out" for limit, resume in LIMITS]
    runs = [[f"fsize:{limit}", *killed["args"][:-3], "-o", str(out), *(["--resume"] if resume else [])]
            for (limit, resume), out in zip(LIMITS, outs, strict=True)]
    return {case: (code, err, out) for case, (code, err), out in zip(LIMITS, run_each(runs, root), outs, strict=True)}


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("resume", [True, False], ids=["resume", "plain"])
@pytest.mark.parametrize("limit", [3000, 12000])
def test_a_file_size_limit_is_an_output_error_and_leaves_no_temporary_file(
        resume: bool, limit: int, limited: dict[tuple[int, bool], Any]) -> None:
    """RLIMIT_FSIZE hit while writing the resume state or an output: exit 7 (SIGXFSZ would
    kill the process), one line, no ``.tmp`` file; without --resume nothing is left at all."""
    code, err, out = limited[limit, resume]
    assert code == 7, err
    line = _one_line(err)
    assert "File too large" in line or "too large" in line.lower(), line
    if resume:
        assert [p.name for p in out.iterdir()] == [STAGING]
        assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    else:
        assert not out.exists()


def test_atomic_write_under_a_file_size_limit_leaves_nothing(tmp_path: Path) -> None:
    code = ("import resource, signal, sys; from pathlib import Path\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))\n"
            "from inspect_model.run.resume import atomic_write\n"
            "from inspect_model.errors import OutputError\n"
            "try:\n    atomic_write(Path(sys.argv[1]), b'x' * 5000)\n"
            "except OutputError as exc:\n    print(exc)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state-0.pt")], capture_output=True, text=True,
                       env=_env(), timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "cannot write the resume state" in r.stdout and "File too large" in r.stdout
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ threads left running
_THREADED = """
import threading, time
from torch import nn

def build():
    threading.Thread(target=time.sleep, args=(600,), name="model-prefetcher").start()  # not a daemon
    return nn.Sequential(nn.Linear(4, 3))
"""


def test_a_thread_the_model_leaves_running_does_not_keep_the_cli_alive(tmp_path: Path) -> None:
    model = tmp_path / "threaded.py"
    model.write_text(_THREADED)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "inspect_model", "summary", f"{model}:build", "--input-size", "4",
                        "--json"], capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["command"] == "summary"
    assert "warning: the model left 1 thread(s) running ('model-prefetcher')" in r.stderr
    assert time.monotonic() - start < 100

_RANK_EXIT = """
import atexit, sys
from pathlib import Path
import torch.distributed  # noqa: F401 - what a run under torchrun has loaded
from inspect_model.cli.launch import _exit_without_finalizing

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))  # the group's destroy_process_group is one


class Finalized:
    def __del__(self):
        (out / "finalized").write_text("ran")


KEEP = Finalized()  # freed only when the interpreter finalizes
print("report", flush=False)
_exit_without_finalizing(0, quiet=True)
"""


@pytest.mark.parametrize("world", ["2", "1"])
def test_a_torchrun_rank_exits_after_its_exit_functions_without_finalizing(world: str, tmp_path: Path) -> None:
    """Under torchrun (WORLD_SIZE > 1) the CLI runs the exit functions (the process group's
    destroy), flushes stdout and leaves with os._exit: no interpreter finalization, where a
    gloo thread still tied to the group can abort the process. One process exits normally."""
    r = subprocess.run([sys.executable, "-c", _RANK_EXIT, str(tmp_path)], capture_output=True, text=True,
                       env=_env(WORLD_SIZE=world), timeout=120, check=False)
    assert r.returncode == 0 and r.stdout == "report\n", r.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "finalized").exists() is (world == "1")



# ------------------------------------------------------------------ the directory lock off POSIX
def test_the_directory_lock_degrades_cleanly_without_fcntl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No fcntl (Windows): a run still writes, commits and cleans up; only the lock between
    processes is gone."""
    from inspect_model.output import dirlock
    from inspect_model.output.files import OutputDir

    monkeypatch.setattr(dirlock, "fcntl", None)
    with OutputDir(tmp_path / "o") as out:
        out.write_text("a.txt", "a")
    assert (tmp_path / "o" / "a.txt").read_text() == "a"
    failed = OutputDir(tmp_path / "new")
    failed.prepare()
    failed.write_text("b.txt", "b")
    failed.abort()
    assert not (tmp_path / "new").exists()


def test_adopt_checks_both_ends_of_every_pair(tmp_path: Path) -> None:
    """The general guard under every resume and merge: OutputDir.adopt takes no pair that
    leaves the directory, and takes nothing when one does."""
    from inspect_model.errors import OutputError
    from inspect_model.output.files import OutputDir

    out = OutputDir(tmp_path / "o").prepare()
    assert out.staging is not None
    staged, final = out.reserve("a.png")
    good = [(staged, final)]
    (tmp_path / "outside").mkdir()
    (out.staging / "up").symlink_to(tmp_path / "outside", target_is_directory=True)
    bad = [[(staged, tmp_path / "x.png")], [(tmp_path / "x.png", final)], [(out.staging / "up" / "f", final)],
           [(staged, out.path / ".." / "x.png")], [(staged, out.staging / "f.png")], [(staged, Path("/etc/passwd"))]]
    for pairs in bad:
        with pytest.raises(OutputError, match="lies outside"):
            out.adopt(good + pairs, [str(final)])
        assert out.pending() == good
    with pytest.raises(OutputError, match="lies outside"):
        out.adopt(good, [str(final), str(tmp_path / "x.png")])
    out.abort()
