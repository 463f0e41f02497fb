"""The preflight for every source (issue 37): torchvision, timm and user models (with or
without a checkpoint) are built on the meta device first, and a model that cannot fit is
refused in one line with the numbers and the ways out, before any weight is allocated.

The sizes are set with ``--model-arg``: a classifier head of 50 million classes makes a
model of about 100 GB in float32, more than any machine this runs on has free; the
cap test lowers the free memory with an address-space limit (``ulimit -v``) instead.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[3]
CAT = str(ROOT / "sample_images" / "cat.jpg")
BIG = """
import torch
from torch import nn


class Big(nn.Module):
    '''Eight blocks of 10,000 x 10,000 (3.2 GB in float32).'''

    def __init__(self, width: int = 10_000, blocks: int = 8):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(width, width) for _ in range(blocks)])

    def forward(self, x):
        return self.blocks(x)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One child imports what a run needs; each command runs in a fork of it, its CPU counted
    with those imports (tests/fixtures/forkrun.py), as a fresh interpreter's would be."""
    from fixtures.forkrun import ForkServer

    forks = ForkServer("import sys, torch, torchvision; import inspect_model.cli.app", tmp_path_factory.mktemp("runs"),
                       timeout=300)
    yield forks
    forks.close()


@pytest.fixture
def run_cli(server):
    def run(*args: str, cap: int | None = None) -> tuple[subprocess.CompletedProcess, float]:
        """The CLI in a child; ``cap``: bytes of address space left to it after its imports."""
        limit = "" if cap is None else (
            "import resource; from inspect_model.loading.preflight import _virtual_size; "
            f"resource.setrlimit(resource.RLIMIT_AS, (_virtual_size() + {cap}, resource.RLIM_INFINITY))")
        r = server.run(*args, before=limit)
        return subprocess.CompletedProcess(args, r["rc"], r["stdout"], r["stderr"]), r["cpu"]

    return run


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["resnet18", "timm:resnet18"])
def test_too_large_torchvision_and_timm_models_are_refused(spec, run_cli):
    if spec.startswith("timm:"):
        pytest.importorskip("timm")
    # resnet18's head: 512 x 50,000,000 + 50,000,000 = 25.65 B parameters, 102.6 GB in float32.
    r, cpu = run_cli("activations", spec, CAT, "--weights", "none", "--model-arg", "num_classes=50000000")
    line = one_line(r)
    name = spec if spec.startswith("timm:") else "resnet18"
    assert line.startswith(f"error: {name} needs 10") and " GB in float32 (weights 102.6 GB + activations " in line
    assert " free in RAM; use --offload, --max-memory, or a smaller --dtype" in line
    print(f"{spec}: refused in {cpu:.1f} s of CPU: {line}")
    assert cpu < 15, f"the refusal took {cpu:.1f} s of CPU"


@pytest.mark.slow
def test_a_user_model_too_large_for_the_free_memory_is_refused(tmp_path, run_cli):
    (tmp_path / "big.py").write_text(BIG)
    start = time.monotonic()
    r, cpu = run_cli("activations", f"{tmp_path / 'big.py'}:Big", "--input-size", "10000", cap=2 * 10**9)
    line = one_line(r)
    # weights only: the user's forward is never run by the preflight (it could hang outside the command's limits)
    assert line.startswith("error: big.py:Big needs 3.2 GB in float32 (weights 3.2 GB); ")
    assert " free in RAM; use --offload" in line
    free = float(line.split("; ")[1].split(" GB free")[0])
    assert 0 < free < 2.0  # under the cap
    print(f"big.py:Big: refused in {cpu:.1f} s of CPU: {line}")
    assert cpu < 15, f"the refusal took {cpu:.1f} s of CPU ({time.monotonic() - start:.1f} s wall)"
    # in the dtype asked for: float64 doubles it
    line = one_line(run_cli("activations", f"{tmp_path / 'big.py'}:Big", "--input-size", "10000", "--dtype",
                            "float64", cap=2 * 10**9)[0])
    assert "needs 6.4 GB in float64 (weights 6.4 GB" in line


@pytest.mark.slow
def test_a_user_model_whose_code_makes_the_weights_is_refused_under_offload_with_the_fix(tmp_path, run_cli):
    """Without --checkpoint its weights come from its code, so it is built whole before it is
    placed: the preflight says so, and names --checkpoint as the way out."""
    (tmp_path / "big.py").write_text(BIG)
    r, _ = run_cli("activations", f"{tmp_path / 'big.py'}:Big", "--input-size", "10000", "--offload",
                   cap=2 * 10**9)
    line = one_line(r)
    assert line.startswith("error: big.py:Big needs 3.2 GB in float32")
    assert line.endswith("its weights come from its own code, so it is built whole before it is placed; give "
                         "--checkpoint FILE (then it is built empty and read block by block) or use a smaller --dtype")


def test_preflight_measures_torchvision_timm_and_user_models_on_meta(tmp_path, monkeypatch):
    """The estimate of each source, from a meta build: weights counted by hand, activations
    of one input from a meta pass; nothing allocated."""
    from inspect_model.errors import ModelLoadError
    from inspect_model.loading import preflight as pf
    from inspect_model.loading.dispatch import preflight
    from inspect_model.loading.loaded import LoadRequest

    from inspect_model.loading.dispatch import fits_check
    from inspect_model.loading.sources import load_model

    (tmp_path / "big.py").write_text(BIG)
    monkeypatch.setattr(pf, "available_memory", lambda: {"cpu": 10**9})
    with pytest.raises(ModelLoadError) as info:  # a user's class: built on meta within its load, then refused
        load_model(f"{tmp_path / 'big.py'}:Big", dtype="bfloat16",
                   check=fits_check(LoadRequest(device="cpu", dtype="bfloat16")))
    params = 8 * (10_000 * 10_000 + 10_000)
    assert f"weights {params * 2 / 1e9:.1f} GB" in str(info.value) and "in bfloat16" in str(info.value)
    assert "1.0 GB free in RAM" in str(info.value)
    preflight("resnet18", LoadRequest(weights="none", device="cpu"))  # 47 MB: fits
    monkeypatch.setattr(pf, "available_memory", lambda: {"cpu": 40 * 10**6})
    with pytest.raises(ModelLoadError, match=r"resnet18 needs .* \(weights 46.8 MB \+ activations "):
        preflight("resnet18", LoadRequest(weights="none", device="cpu"))
    with pytest.raises(ModelLoadError, match=r"resnet18 needs .* \(weights 23.4 MB"):
        preflight("resnet18", LoadRequest(weights="none", device="cpu", dtype="float16", model_args={}))


def test_image_activations_come_from_a_meta_pass():
    """Every leaf layer's output for one image, counted on a real resnet18 by hand."""
    import torch

    from inspect_model.loading.preflight import image_activations
    from inspect_model.loading.sources import load_model

    model = load_model("resnet18", weights="none").model
    by_hand = 0

    def count(_m, _i, out):
        nonlocal by_hand
        by_hand += out.numel() * out.element_size()

    hooks = [m.register_forward_hook(count) for m in model.modules() if not list(m.children())]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    for h in hooks:
        h.remove()
    meta = load_model("resnet18", weights="none", device="meta")
    assert image_activations(meta) == by_hand > 64 * 112 * 112 * 4


def test_a_users_factory_is_not_run_twice(tmp_path, cli):
    """Only a class is built on meta for the preflight: a factory may cache, train or load
    (tests/fixtures/dense.py caches trained models), so it runs once, for the real build."""
    calls = tmp_path / "calls.txt"
    (tmp_path / "net.py").write_text(f"""
import torch


def build():
    with open({str(calls)!r}, "a") as fh:
        fh.write("x")
    return torch.nn.Sequential(torch.nn.Linear(4, 4))


class Net(torch.nn.Sequential):
    def __init__(self):
        with open({str(calls)!r}, "a") as fh:
            fh.write("c")
        super().__init__(torch.nn.Linear(4, 4))
""")
    for name in ("build", "Net"):
        calls.write_text("")
        r = cli(["activations", f"{tmp_path / 'net.py'}:{name}", "--input-size", "4", "--json", "-q"])
        assert r.exit_code == 0, r.stderr
        assert calls.read_text() == {"build": "x", "Net": "cc"}[name]  # the class: once on meta, once for real
