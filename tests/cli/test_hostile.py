"""Hostile files and real faults (issue 13): no code runs unasked, no output lost, no
silent exit. Each test reproduces the attack or the fault: pickle payloads try to write a
marker file (which must not appear), concurrency uses two real processes, and signals are
sent to a real child process."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import register_model
from fixtures.models import TinyCNN
from inspect_model import errors

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
ROOT = Path(__file__).resolve().parents[2]
IN = ["--weights", "none", "--input-size", "3x8x8", "--quiet"]


class Payload:
    """Unpickling this writes ``marker``: the attacker's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _payload(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    return buf.getvalue()


# ------------------------------------------------------------------ .pt2 archives
def _export(path: Path) -> Path:
    ep = torch.export.export(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), (torch.randn(1, 3, 8, 8),))
    torch.export.save(ep, str(path))
    return path


def _rewrite(src: Path, dst: Path, change) -> Path:  # type: ignore[no-untyped-def]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def _evil_weights(tmp: Path, marker: Path) -> Path:
    def change(name: str, data: bytes) -> bytes:
        if name.endswith("model_weights_config.json"):
            cfg = json.loads(data)
            cfg["config"]["0.weight"]["use_pickle"] = True
            return json.dumps(cfg).encode()
        if name.endswith("data/weights/weight_0"):
            return _payload(marker)
        return data

    return _rewrite(_export(tmp / "ok.pt2"), tmp / "evil.pt2", change)


def _evil_sample_inputs(tmp: Path, marker: Path) -> Path:
    def change(name: str, data: bytes) -> bytes:
        return _payload(marker) if name.endswith("data/sample_inputs/model.pt") else data

    return _rewrite(_export(tmp / "ok.pt2"), tmp / "evil_inputs.pt2", change)


def _evil_opaque_constant(tmp: Path, marker: Path) -> Path:
    import pickle

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("model_constants_config.json"):
            return json.dumps({"config": {"c": {"path_name": "opaque_obj_0", "is_param": False,
                                                "use_pickle": True}}}).encode()
        return data

    out = _rewrite(_export(tmp / "ok.pt2"), tmp / "evil_const.pt2", change)
    with zipfile.ZipFile(out, "a") as zf:
        root = zf.namelist()[0].split("/", 1)[0]
        zf.writestr(f"{root}/data/constants/opaque_obj_0", pickle.dumps(Payload(marker)))
    return out


@pytest.mark.parametrize(("make", "entry"), [
    (_evil_weights, "data/weights/weight_0"),
    (_evil_sample_inputs, "data/sample_inputs/model.pt"),
    (_evil_opaque_constant, "data/constants/opaque_obj_0"),
], ids=["weights-use-pickle", "sample-inputs-pickle", "opaque-constant"])
def test_pt2_with_pickled_entry_is_refused(make, entry: str, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    path = make(tmp_path, marker)
    res = cli(["summary", str(path), "--input-size", "3x8x8"])
    assert res.exit_code == errors.EXIT_MODEL_LOAD, res.stderr
    assert entry in res.stderr and "--trust-checkpoint" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not marker.exists(), "the archive's code ran"


def test_forbid_full_unpickling_is_a_second_belt(tmp_path: Path) -> None:
    """Even if inspection missed an entry, torch's loader cannot unpickle during the load."""
    from inspect_model.errors import ModelLoadError
    from inspect_model.loading.archive_guard import forbid_full_unpickling

    marker = tmp_path / "marker"
    path = _evil_weights(tmp_path, marker)
    with pytest.raises(ModelLoadError, match="full unpickling"), forbid_full_unpickling(str(path)):
        torch.export.load(str(path))
    assert not marker.exists()
    assert torch.load.__name__ == "load"  # put back


def test_clean_pt2_still_loads(tmp_path: Path, cli) -> None:
    res = cli(["summary", str(_export(tmp_path / "m.pt2")), "--json"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["command"] == "summary"


# ------------------------------------------------------------------ hub cache
def test_poisoned_hub_cache_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    marker = tmp_path / "marker"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    cache = tmp_path / "th" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    (cache / "resnet18-f37072fd.pth").write_bytes(_payload(marker))
    res = cli(["activations", "resnet18", "--input-size", "3x16x16", "--quiet", "-l", "fc"])
    assert res.exit_code == errors.EXIT_MODEL_LOAD, res.stderr
    assert "resnet18-f37072fd.pth" in res.stderr and "sha256" in res.stderr
    assert not marker.exists()


def test_hashed_weights_file_is_read_without_unpickling(tmp_path: Path) -> None:
    """A file whose hash matches its name (the attacker named it) is still only read with
    weights_only=True; a real state_dict with a matching name loads."""
    from inspect_model.errors import ModelLoadError
    from inspect_model.loading.hub_weights import read_weights_file, sha256_file

    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pth"
    evil.write_bytes(_payload(marker))
    named = evil.rename(tmp_path / f"net-{sha256_file(str(evil))[:8]}.pth")
    with pytest.raises(ModelLoadError, match="Python objects"):
        read_weights_file(str(named))
    assert not marker.exists()
    good = tmp_path / "good.pth"
    torch.save(TinyCNN().state_dict(), good)
    good = good.rename(tmp_path / f"tiny-{sha256_file(str(good))[:8]}.pth")
    assert set(read_weights_file(str(good))) == set(TinyCNN().state_dict())


# ------------------------------------------------------------------ terminal escapes
def test_control_characters_escaped_in_text_kept_in_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         cli) -> None:
    from collections import OrderedDict

    evil = "\x1b]0;pwned\x07\x1b[31mred"
    model = nn.Sequential(OrderedDict([(evil, nn.Linear(4, 4)), ("act", nn.ReLU())]))
    spec = register_model(monkeypatch, model)
    text = cli(["summary", spec, "--input-size", "4", "-o", str(tmp_path / "o")])
    assert text.exit_code == 0, text.stderr
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout and "\\x1b]0;pwned" in text.stdout
    report = (tmp_path / "o" / "report.txt").read_text()
    assert "\x1b" not in report and "\\x1b]0;pwned" in report
    doc = cli(["summary", spec, "--input-size", "4", "--json"])
    assert evil in [layer["name"] for layer in json.loads(doc.stdout)["layers"]]  # JSON: the exact string
    missing = cli(["cam", spec, "--weights", "none", str(tmp_path / f"{evil}.jpg")])
    assert missing.exit_code == errors.EXIT_INPUT
    assert "\x1b" not in missing.stderr and "\\x1b" in missing.stderr


# ------------------------------------------------------------------ sys.exit in model code
class ExitsInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sys.exit(0)


@pytest.mark.parametrize("argv", [["check"], ["grads", "--fail-on", "nan"]], ids=["check", "grads-fail-on"])
def test_sys_exit_in_forward_is_exit_6(argv: list[str], monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, ExitsInForward())
    res = cli([argv[0], spec, "--weights", "none", "--input-size", "4", *argv[1:]])
    assert res.exit_code == errors.EXIT_RUNTIME
    assert res.stderr.strip().splitlines()[-1] == "error: model code called sys.exit(0); the model did not finish running"


def test_sys_exit_in_factory_is_exit_6(tmp_path: Path, cli) -> None:
    f = tmp_path / "m.py"
    f.write_text("import sys\ndef build():\n    sys.exit()\n")
    res = cli(["check", f"{f}:build", "--input-size", "4"])
    assert res.exit_code == errors.EXIT_RUNTIME
    assert "error: model code called sys.exit()" in res.stderr


# ------------------------------------------------------------------ two processes, one directory
_HOLDER = """
import sys, time
from inspect_model.output.files import DirLock
lock = DirLock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
lock.release(failed=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MPLBACKEND": "Agg"}


def _holder(out: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(seconds)], stdout=subprocess.PIPE,
                            text=True, env=_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_second_run_on_a_locked_directory_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """Run A (another process) holds the directory, then fails and removes what it created;
    run B is refused at once instead of mixing files with A's or losing its own to A's cleanup."""
    spec = register_model(monkeypatch, TinyCNN())
    out = tmp_path / "out"
    proc = _holder(out, 30)
    try:
        res = cli(["cam", spec, *IN, "-o", str(out)])
    finally:
        proc.kill()
        proc.wait()
    assert res.exit_code == errors.EXIT_OUTPUT
    assert "in use by another inspect-model run" in res.stderr and "--wait" in res.stderr


def test_wait_runs_after_the_other_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, TinyCNN())
    out = tmp_path / "out"
    proc = _holder(out, 1.0)  # a failing run A: it created the directory and removes it
    res = cli(["cam", spec, *IN, "-o", str(out), "--wait"])
    assert proc.wait(timeout=30) == 0
    assert res.exit_code == 0, res.stderr
    assert (out / "report.json").is_file(), "B's finished result was lost"
    assert not list(out.glob(".inspect-model-staging-*"))


def test_stale_staging_of_dead_run_is_cleaned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, TinyCNN())
    out = tmp_path / "out"
    (out / ".inspect-model-staging-dead1234" / "images").mkdir(parents=True)  # left by kill -9
    res = cli(["cam", spec, *IN, "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    assert not list(out.glob(".inspect-model-staging-*"))


# ------------------------------------------------------------------ signals
_SLOW = """
import os, time, torch
from torch import nn

class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)
    def forward(self, x):
        open(os.environ["READY_FILE"], "w").close()
        time.sleep(60)
        return self.fc(self.conv(x).mean((2, 3)))
"""


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGTERM, 143, "terminated"),
                                                    (signal.SIGINT, 130, "interrupted")], ids=["TERM", "INT"])
def test_signal_cleans_up_and_says_so(sig: int, code: int, word: str, tmp_path: Path) -> None:
    model = tmp_path / "slow.py"
    model.write_text(_SLOW)
    ready = tmp_path / "ready"
    out = tmp_path / "out" / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "inspect_model", "cam", f"{model}:Slow", "--input-size", "3x8x8", "--quiet",
         "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**_env(), "READY_FILE": str(ready)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509 - as in a terminal
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert out.is_dir()  # the run made it
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], err
    assert not (tmp_path / "out").exists(), "the run's directory was left behind"


# ------------------------------------------------------------------ fail fast, skip, notes
_IMPORTED = """
import sys
from inspect_model.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print(exc.code, "torch" in sys.modules)
"""


@pytest.mark.parametrize("argv", [
    ["cam", "resnet18", "--input-size", "banana"],
    ["grads", "resnet18", "--target", "top:0"],
    ["cam", "resnet18", "--target", "-1"],
    ["activations", "resnet18", "/no/such/image.jpg"],
    ["check", "resnet18", "--max-seconds", "-5"],
    ["cam", "resnet18", "--batch-size", "0"],
    ["summary", "resnet18", "--depth", "-1"],
    ["cam", "resnet18", "--input-size", "3x100000x100000"],
    ["cam", "resnet18", "--config", "/no/such.toml"],
], ids=["input-size", "target-top0", "target-negative", "missing-image", "max-seconds", "batch-zero", "depth",
        "memory", "config-missing"])
def test_argument_errors_do_not_import_torch(argv: list[str]) -> None:
    """Argument errors that need no model fail before torch is imported (the slow part)."""
    res = subprocess.run([sys.executable, "-c", _IMPORTED, *argv], capture_output=True, text=True, env=_env(),
                         timeout=60, check=False)
    code, imported = res.stdout.split()
    assert code in ("2", "4") and res.stderr.startswith("error: "), res.stderr
    assert imported == "False", f"torch was imported before the argument error: {res.stderr}"


def test_skip_bad_inputs_skips_missing_stdin_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    from PIL import Image

    spec = register_model(monkeypatch, TinyCNN())
    good = tmp_path / "good.png"
    Image.new("RGB", (16, 16), (10, 200, 30)).save(good)
    res = cli(["activations", spec, "--weights", "none", "--skip-bad-inputs", "--json", "-"],
              stdin=f"{good}\n{tmp_path / 'ghost.jpg'}\n")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [s["path"] for s in doc["skipped"]] == [str(tmp_path / "ghost.jpg")]
    assert "ghost.jpg" in res.stderr


def test_int64_checkpoint_cast_is_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = TinyCNN()
    spec = register_model(monkeypatch, model)
    sd = {k: (v * 100).round().long() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save(sd, tmp_path / "ints.pt")
    res = cli(["activations", spec, "--weights", "none", "--input-size", "3x8x8", "--checkpoint",
               str(tmp_path / "ints.pt")])
    assert res.exit_code == 0, res.stderr
    assert "cast to the model's dtype" in res.stderr and "int64 -> float32" in res.stderr


# ------------------------------------------------------------------ messages that mislead (issue 13, 10)
def test_static_batch_pt2_has_one_clear_message(tmp_path: Path, cli) -> None:
    """A program exported for a batch of 2: one error saying so and giving --batch-size 2,
    no note claiming the inputs are fed in batches of 2; with --batch-size 2 it runs."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    path = tmp_path / "b2.pt2"
    torch.export.save(torch.export.export(net, (torch.randn(2, 3, 8, 8),)), str(path))
    for command in ("summary", "cam"):
        res = cli([command, str(path)])
        assert res.exit_code == errors.EXIT_INPUT, (command, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert not [ln for ln in lines if "batch" in ln and not ln.startswith("error: ")], res.stderr
        assert lines[-1].startswith("error: ") and "static batch size of 2" in lines[-1]
        assert "pass --batch-size 2" in lines[-1]
    res = cli(["cam", str(path), "--batch-size", "2", "--quiet"])  # the layer probe feeds a whole batch too
    assert res.exit_code == 0, res.stderr


class Warns(nn.Module):
    """Warns twice per forward (the same message) and trips numpy's "Mean of empty slice"."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import warnings

        import numpy as np

        for _ in range(2):
            warnings.warn("this model is only a test")
        np.mean(np.array([]))
        return self.fc(x)


@pytest.mark.parametrize("command", ["activations", "grads", "summary"])
def test_python_warnings_become_one_line_notes(command: str, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, Warns())
    argv = [command, spec, "--input-size", "4"] + (["--device", "cpu"] if command == "summary" else ["--weights", "none"])
    res = cli(argv)
    assert res.exit_code == 0, res.stderr
    warned = [ln for ln in res.stderr.splitlines() if "this model is only a test" in ln]
    assert warned == ["warning: this model is only a test (x2)"], res.stderr
    empty = [ln for ln in res.stderr.splitlines() if "Mean of empty slice" in ln]
    assert len(empty) == 1 and empty[0].startswith("warning: Mean of empty slice"), res.stderr
    assert "UserWarning" not in res.stderr and "warnings.warn(" not in res.stderr and "np.mean" not in res.stderr
    quiet = cli([*argv, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr


def test_warnings_come_before_the_error_line(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    spec = register_model(monkeypatch, Warns())
    res = cli(["grads", spec, "--weights", "none", "--input-size", "5"])  # Linear(4, 3) on 5 features
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == errors.EXIT_INPUT and lines[-1].startswith("error: "), res.stderr
    assert "warning: this model is only a test (x2)" in lines[:-1]  # warned, then fc failed
