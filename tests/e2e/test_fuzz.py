"""Fuzzing with random architectures (issue 9): Hypothesis draws small networks from
tests/fixtures/random_nets.py (convolutions, in-place and functional ReLUs, a module called
twice, residual branches, nested containers, batch norm in train mode, tuple and dict
outputs) and inputs; every subcommand runs on each through the CLI without crashing, and the
model is given back untouched.

A clean :class:`InspectModelError` (one ``error: ...`` line, a documented exit code) is
acceptable where a network legitimately cannot be handled; an unforeseen exception (the
edge's ``error: unexpected ...``) or a traceback is a bug. The "ci" profile (tests/conftest.py)
uses a fixed seed and 40 examples per subcommand; ``--hypothesis-profile long`` runs 600.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import run_cli
from fixtures.invariants import assert_same, relu_functions, snapshot
from fixtures.random_nets import NetSpec, RandomNet, net_specs
from inspect_model import errors

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

CLEAN_CODES = {errors.EXIT_USAGE, errors.EXIT_MODEL_LOAD, errors.EXIT_INPUT, errors.EXIT_LAYER,
               errors.EXIT_RUNTIME}
OUTPUT_KEY = {"tensor": [], "tuple": ["--output-key", "0"], "dict": ["--output-key", "logits"]}
TAKES_OUTPUT_KEY = ("grads", "guided-backprop", "cam", "check")
WRITES_FILES = ("activations", "grads", "guided-backprop", "cam")
MODULE = "_inspect_model_fuzz_models"

COMMANDS = {  # per command: a strategy of extra options worth varying
    "summary": st.sampled_from([[], ["--device", "cpu"], ["--depth", "2"]]),
    "activations": st.sampled_from([[], ["--layers", "body.*"], ["--layers", "type:Conv2d", "--scale", "layer"]]),
    "grads": st.sampled_from([[], ["--loss", "cross-entropy", "--label", "0"], ["--of", "fc", "--wrt", "body.0"],
                              ["--target", "top:2", "--clip-norm", "1"]]),
    "guided-backprop": st.sampled_from([[], ["--activations"], ["--guided-gradcam"], ["--target", "1"]]),
    "cam": st.sampled_from([[], ["--method", "all"], ["--method", "scorecam", "--scorecam-batch", "3"],
                            ["--method", "eigencam", "--layer", "body.0"], ["--target", "top:2"]]),
    "check": st.sampled_from([[], ["--deterministic"]]),
}


def _dirty(net: RandomNet, spec: NetSpec) -> None:
    """Some parameters with gradients, one frozen: state a run must give back."""
    params = list(net.parameters())
    params[0].grad = torch.ones_like(params[0])
    if spec.train_mode and len(params) > 2:
        params[1].requires_grad_(False)


def _run(command: str, spec: NetSpec, extra: list[str], seed: int, write: bool) -> None:
    torch.manual_seed(seed)
    net = RandomNet(spec)
    _dirty(net, spec)
    module = type(sys)(MODULE)
    module.net = net  # type: ignore[attr-defined]
    sys.modules[MODULE] = module
    before, relus = snapshot(net), relu_functions()
    argv = [command, f"{MODULE}:net", "--input-size", f"{spec.in_ch}x{spec.hw}x{spec.hw}",
            "--batch-size", str(spec.batch), "--json", *extra]
    if command != "summary":
        argv += ["--weights", "none", "--seed", str(seed)]
    if command in TAKES_OUTPUT_KEY:
        argv += OUTPUT_KEY[spec.head]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out"
            if write and command in WRITES_FILES:
                argv += ["--output-dir", str(out)]
            res = run_cli(argv)
            assert "Traceback" not in res.stderr, res.stderr
            if res.exit_code == 0:
                doc = json.loads(res.stdout)
                assert doc["command"] == command
                for f in doc.get("files") or []:  # relative to the output directory
                    assert (out / f).resolve().is_relative_to(out.resolve()), f
                    assert (out / f).is_file(), f
            else:
                line = res.stderr.strip().splitlines()[-1]
                assert line.startswith("error: ") and not line.startswith("error: unexpected"), (spec, argv, line)
                verdict = command == "check" and res.exit_code == errors.EXIT_CHECK_FAILED  # e.g. a dead layer
                assert verdict or res.exit_code in CLEAN_CODES, (res.exit_code, line)
                assert not out.exists(), "a failed run left its output directory"
        assert_same(net, before)
        assert relu_functions() == relus
    finally:
        sys.modules.pop(MODULE, None)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_random_networks(command: str) -> None:
    # PNG rendering dominates the time: write files in one example of four.
    @given(spec=net_specs(), extra=COMMANDS[command], seed=st.integers(0, 2**16),
           write=st.sampled_from([False, False, False, True]))
    def check(spec: NetSpec, extra: list[str], seed: int, write: bool) -> None:
        _run(command, spec, extra, seed, write)

    check()


def test_strategy_draws_every_block_and_head() -> None:
    """The strategy reaches each kind of block and head the fuzz relies on."""
    from fixtures.random_nets import BLOCKS, HEADS

    seen_blocks: set[str] = set()
    seen_heads: set[str] = set()

    @given(spec=net_specs())
    def collect(spec: NetSpec) -> None:
        seen_blocks.update(spec.blocks)
        seen_heads.add(spec.head)
        net = RandomNet(spec)
        out = net(torch.randn(spec.batch, spec.in_ch, spec.hw, spec.hw))
        logits = out if spec.head == "tensor" else (out[0] if spec.head == "tuple" else out["logits"])
        assert logits.shape == (spec.batch, spec.classes)

    collect()
    assert seen_blocks == set(BLOCKS) and seen_heads == set(HEADS)
