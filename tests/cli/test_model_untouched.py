"""The user's model is never changed (issue 9), by any subcommand, also when a run fails
part-way: in the forward pass, in the backward pass, or while writing files.

Each case hands the CLI a model object (registered in ``sys.modules``, used as it is) that
carries state a careless run would disturb: batch norm in train mode, ``.grad`` fields set
on some parameters and None on others, a frozen parameter, an in-place ReLU. After the run,
:func:`fixtures.invariants.assert_same` checks hooks, state_dict bits, dtypes, devices,
training and ``requires_grad`` flags, ``.grad`` fields, module attributes, and that no
function in torch (``F.relu``, ``torch.relu``, ``Tensor.relu``...) is left patched.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import assert_same, register_model, relu_functions, snapshot
from fixtures.models import TinyCNN

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

COMMANDS = ("summary", "activations", "grads", "guided-backprop", "cam", "attributions", "check")
WRITES_FILES = ("summary", "activations", "grads", "guided-backprop", "cam", "attributions")


class _BackwardBoom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def, override]
        raise RuntimeError("backward boom")


class Fragile(nn.Module):
    """TinyCNN's shape with a switch to fail late in the forward pass or in the backward."""

    def __init__(self, fail: str | None = None) -> None:
        super().__init__()
        self.fail = fail
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(inplace=True),
                                      nn.Conv2d(6, 8, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        if self.fail == "forward":
            raise RuntimeError("forward boom")
        if self.fail == "backward":
            h = _BackwardBoom.apply(h)
        return self.fc(torch.flatten(self.pool(h), 1))


def _dirty(model: nn.Module) -> nn.Module:
    """State a run must give back as it found it."""
    model.train()
    params = list(model.parameters())
    params[0].grad = torch.full_like(params[0], 0.25)  # an accumulated gradient
    params[-1].requires_grad_(False)  # a frozen head bias
    return model


IN = ["--weights", "none", "--input-size", "3x8x8", "--quiet"]
EXTRA = {  # per command: options that exercise more of it
    "summary": [["--depth", "1"], ["--device", "cpu"]],
    "activations": [["--layers", "features.*", "--save-raw"], ["--dtype", "float64", "--batch-size", "3"]],
    "grads": [["--clip-norm", "1.0", "--loss", "cross-entropy", "--label", "1"],
              ["--of", "fc", "--wrt", "features.3", "--jacobian-norm", "--probes", "4"], ["--dtype", "float64"]],
    "guided-backprop": [["--guided-gradcam", "--save-raw"], ["--sanity", "--activations"], ["--dtype", "float64"]],
    "cam": [["--method", "all", "--save-raw"], ["--method", "scorecam", "--method", "eigencam",
                                                 "--layer", "features.3", "--layer", "features.4", "--fuse"],
            ["--dtype", "float64", "--batch-size", "2"]],
    "attributions": [["--method", "all", "--steps", "4", "--samples", "2", "--window", "4", "--save-raw"],
                     ["--method", "ig", "--smooth", "--sanity", "--samples", "2", "--steps", "3"],
                     ["--dtype", "float64", "-m", "occlusion,guided", "--window", "4"]],
    "check": [["--deterministic", "--max-dead-fraction", "1.0"], ["--dtype", "float64"]],
}


def _argv(command: str, spec: str, extra: list[str], out: Path | None) -> list[str]:
    size = IN if command != "check" else [a for a in IN if a != "--quiet"]
    argv = [command, spec, *size, *extra]
    if out is not None and command in WRITES_FILES:
        argv += ["--output-dir", str(out)]
    return argv


def _check(model: nn.Module, before: dict, relus: tuple) -> None:
    assert_same(model, before)
    assert relu_functions() == relus, "a ReLU function or Module.__call__ is left patched"


RUNS = [(cmd, i) for cmd in COMMANDS for i in range(-1, len(EXTRA[cmd]))]


@pytest.mark.parametrize(("command", "variant"), RUNS, ids=[f"{c}-{i}" for c, i in RUNS])
def test_successful_runs_leave_the_model_alone(command: str, variant: int, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = _dirty(Fragile())
    spec = register_model(monkeypatch, model)
    before, relus = snapshot(model), relu_functions()
    extra = EXTRA[command][variant] if variant >= 0 else []
    res = cli(_argv(command, spec, extra, tmp_path / "out"))
    assert res.exit_code == 0, res.stderr
    _check(model, before, relus)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("fail", ["forward", "backward"])
def test_runs_failing_in_the_model_leave_it_alone(command: str, fail: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = _dirty(Fragile(fail=fail))
    spec = register_model(monkeypatch, model)
    before, relus = snapshot(model), relu_functions()
    res = cli(_argv(command, spec, [], tmp_path / "out"))
    assert "Traceback" not in res.stderr
    needs_backward = command in ("grads", "guided-backprop", "cam", "attributions", "check")
    if fail == "forward" or needs_backward:
        assert res.exit_code == 6, res.stderr
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and not line.startswith("error: unexpected"), line
        assert f"{fail} boom" in line, line
        assert not (tmp_path / "out").exists(), "a failed run left its output directory"
    else:
        assert res.exit_code == 0, res.stderr
    _check(model, before, relus)


@pytest.mark.parametrize("command", WRITES_FILES)
def test_runs_failing_while_writing_leave_it_alone(command: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = _dirty(Fragile())
    spec = register_model(monkeypatch, model)
    before, relus = snapshot(model), relu_functions()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    res = cli(_argv(command, spec, [], tmp_path / "out"))
    monkeypatch.undo()
    assert res.exit_code == 7, res.stderr
    assert "No space left on device" in res.stderr
    assert not (tmp_path / "out").exists()
    _check(model, before, relus)


@pytest.mark.parametrize("command", ("activations", "grads", "guided-backprop", "cam"))
def test_interrupted_runs_leave_it_alone(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         cli) -> None:
    """Ctrl-C in the middle of the forward pass (hooks registered, flags changed)."""
    model = _dirty(Fragile())

    def interrupt(mod: nn.Module, args: tuple) -> None:
        raise KeyboardInterrupt

    handle = model.features[3].register_forward_pre_hook(interrupt)  # the user's own hook stays
    spec = register_model(monkeypatch, model)
    before, relus = snapshot(model), relu_functions()
    res = cli(_argv(command, spec, [], tmp_path / "out"))
    assert res.exit_code == 130, res.stderr
    assert not (tmp_path / "out").exists()
    _check(model, before, relus)
    handle.remove()


def test_dtype_run_does_not_cast_the_users_instance(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """--dtype float64 casts a copy: the user's float32 instance stays float32 (a bug fixed
    in issue 9: commands cast the loaded model in place, and an instance is used as is)."""
    model = TinyCNN()
    spec = register_model(monkeypatch, model)
    for command in ("activations", "grads", "guided-backprop", "cam", "check"):
        res = cli([command, spec, *IN, "--dtype", "float64"])
        assert res.exit_code == 0, res.stderr
        assert {p.dtype for p in model.parameters()} == {torch.float32}, command


def test_checkpoint_goes_into_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = TinyCNN()
    other = TinyCNN()
    torch.nn.init.constant_(other.fc.weight, 0.5)
    torch.save(other.state_dict(), tmp_path / "w.pt")
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli(["activations", spec, *IN, "--checkpoint", str(tmp_path / "w.pt"), "--layers", "fc", "--json"])
    assert res.exit_code == 0, res.stderr
    assert_same(model, before)
    assert not torch.equal(model.fc.weight, other.fc.weight)


class Aliased(nn.Module):
    """One conv block registered under several names (four places in a Sequential and an
    attribute), the case where ``functional_call(tie_weights=True)`` raises
    (pytorch/pytorch#164759) and used to leave meta tensors in the user's model."""

    def __init__(self, fail: str | None = None) -> None:
        super().__init__()
        self.fail = fail
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        shared = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.blocks = nn.Sequential(shared, shared, shared, shared)
        self.again = shared
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        if self.fail == "forward":
            raise RuntimeError("forward boom")
        return self.fc(torch.flatten(self.pool(h), 1))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("fail", [None, "forward"])
def test_a_module_under_several_names_is_left_alone(command: str, fail: str | None, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = _dirty(Aliased(fail=fail))
    spec = register_model(monkeypatch, model)
    before, relus = snapshot(model), relu_functions()
    res = cli(_argv(command, spec, [], tmp_path / "out"))
    assert "Traceback" not in res.stderr and "unexpected" not in res.stderr, res.stderr
    assert res.exit_code == (0 if fail is None else 6), res.stderr
    _check(model, before, relus)
    model.fail = None
    model.eval()(torch.randn(1, 3, 8, 8))  # still runs: no meta tensor left behind


def test_a_module_under_several_names_summarises_counting_shared_params_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    import inspect_model as im

    lin = nn.Linear(8, 8)
    model = nn.Sequential(lin, lin, lin, lin)
    before = snapshot(model)
    res = im.summary(model, input_size=["8"])
    assert res.error is None
    assert res.total_params == 72  # 8*8 + 8, once
    assert sum(r.params for r in res.rows) == 72
    assert res.total_macs == 4 * 64  # called four times
    assert_same(model, before)
    model(torch.randn(2, 8))
    # The CLI with --checkpoint (a real model, meta copies swapped in) did fail "unexpected".
    torch.save(model.state_dict(), tmp_path / "w.pt")
    before = snapshot(model)  # torch.save caches Tensor.__slotnames__
    spec = register_model(monkeypatch, model)
    out = cli(["summary", spec, "--input-size", "8", "--checkpoint", str(tmp_path / "w.pt"), "--json"])
    assert out.exit_code == 0, out.stderr
    assert_same(model, before)


def test_a_failing_swap_gives_every_tensor_back() -> None:
    from inspect_model.engine.swap import swapped_tensors

    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.BatchNorm1d(4), lin)
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="mid-swap"), \
            swapped_tensors(model, lambda t: torch.empty_like(t, device="meta")):
        assert model[0].weight.device.type == "meta" and model[2].weight is model[0].weight
        raise RuntimeError("mid-swap")
    assert_same(model, before)
