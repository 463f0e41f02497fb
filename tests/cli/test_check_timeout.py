"""`check --max-seconds` is a timeout (issue 28.14): a model that hangs fails the check at
the budget instead of keeping CI waiting, with one line on stderr and exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fixtures.models import assert_unchanged, model_state
from inspect_model.engine.selection import select_layers
from inspect_model.methods.checks.smoke import run_checks

HANGS = '''
import signal
import time

import torch
from torch import nn


class Hangs(nn.Module):
    """Waits for ever in Python (a sleep loop): SIGALRM unwinds it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        while True:
            time.sleep(0.05)


class Stuck(Hangs):
    """Blocks SIGALRM first, as code stuck in C would never see it: only the watchdog helps."""

    def forward(self, x):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(120)
'''


@pytest.fixture
def hangs(tmp_path: Path) -> Path:
    p = tmp_path / "hangs.py"
    p.write_text(HANGS)
    return p


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="no SIGALRM on this platform")
def test_a_hanging_model_fails_at_the_budget(cli, hangs: Path) -> None:
    t0 = time.monotonic()
    res = cli(["check", f"{hangs}:Hangs", "--input-size", "4", "--max-seconds", "1", "--expect-params", "10",
               "--json"])
    assert time.monotonic() - t0 < 30  # stopped, not waiting for ever
    assert res.exit_code == 1, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: check failed: time 1.") and line.endswith(" (expected <= 1)"), line
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["time"]["status"] == "fail" and checks["time"]["threshold"] == 1
    assert "stopped at the budget" in checks["time"]["detail"]
    assert checks["params"]["status"] == "pass"  # what was checked before the passes stays


def test_the_model_is_given_back_after_a_timeout(hangs: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hangs", hangs)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import signal

    m = mod.Hangs()
    before, handler = model_state(m), signal.getsignal(signal.SIGALRM)
    res = run_checks(m, (torch.randn(1, 4),), layers=select_layers(m), max_seconds=0.3)
    assert [(r.name, r.passed) for r in res] == [("time", False)]
    assert_unchanged(m, before)  # hooks removed, flags restored
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signal masks")
def test_a_model_stuck_out_of_reach_ends_the_process_with_one_line(hangs: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "inspect_model", "check", f"{hangs}:Stuck", "--input-size", "4",
                           "--max-seconds", "1"], capture_output=True, text=True, env=env, timeout=100)
    assert time.monotonic() - t0 < 90
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: check failed: time > 1 s (--max-seconds): the model did not return, and could not be stopped "
        "for 3 s; exiting"]


def test_the_preflight_never_runs_a_user_forward(tmp_path):
    """The preflight of a user's class counts its weights on the meta device; it does not call
    its forward (a model's code runs only under the command's own limits)."""
    from types import SimpleNamespace

    import torch

    from inspect_model.loading.dispatch import fits_check

    calls = []

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            calls.append(x.device)
            return self.fc(x)

    with torch.device("meta"):
        meta = Net()
    fits_check(SimpleNamespace(device="cpu", dtype=None))(meta, "net.py:Net")
    assert calls == []
