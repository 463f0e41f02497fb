"""compare's worker thread (a daemon that lives as long as the process; A's forward runs there
when B's outputs reach the budget) and fork: a child forked after a compare has no worker;
its own compare starts one and finishes. (With
torch on more than one thread, a child forked after *any* parallel torch op, a plain forward
with no compare at all, hangs in GNU OpenMP's thread pool: libgomp is not fork-safe. That is
torch's, not compare's, hence one thread here.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import os, sys, torch
torch.set_num_threads(1)
from torch import nn
from inspect_model.engine.selection import select_layers
from inspect_model.methods.compare.passes import run_batches
from inspect_model.methods.compare.sides import EagerSide
from inspect_model.methods.compare import exchange

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Flatten(),
                         nn.Linear(8 * 14 * 14, 4)).eval()

a, b = model(), model()
pairs = {n: n for n in select_layers(a)}
x = torch.randn(2, 3, 16, 16)

def compare():
    done = run_batches(a, EagerSide(b, pairs), [x], lambda t: ((t,), {}), pairs, tolerance=1e-3, low=None,
                       budget=4096)  # under one output: A's forward runs in the worker thread, beside B's
    assert len(done.sums) == len(pairs) and all(s.sq_d == 0.0 for s in done.sums.values())

compare()
parent_worker = exchange._worker
assert parent_worker is not None and parent_worker.is_alive()
pid = os.fork()
if pid == 0:
    try:
        assert exchange._worker is None  # reset after the fork: the parent's thread is not here
        compare()
        assert exchange._worker is not None and exchange._worker.is_alive()
        code = 0
    except BaseException as exc:
        print("child:", repr(exc), file=sys.stderr, flush=True)
        code = 3
    os._exit(code)
_, status = os.waitpid(pid, 0)
compare()  # the parent's worker still serves
assert exchange._worker is parent_worker
print("child exit", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_after_compare_compares_again() -> None:
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child exit 0", r.stderr
