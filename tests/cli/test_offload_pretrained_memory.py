"""Pretrained torchvision weights, offloaded, add about nothing to the block-by-block build (issue 37).

resnet50's DEFAULT weights (102 MB in float32; a seeded stand-in written where torch's hub
cache looks) under ``--offload``: built empty, the cached file memory-mapped and read one block
at a time, each block written to the offload folder and freed. The peak RSS that run adds above
its imports stays within one block (24 MB, ``layer4.0``) of the same command with
``--weights none --offload`` (random weights made block by block): measured 82 MB vs 79 MB,
while the resident pretrained run added 230 MB. Numbers printed with ``-s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

# The stand-in cannot have the real file's sha256 prefix: the CLI is run with the check told this
# file's own (the check itself is tested in tests/cli/test_hostile.py). The modules a run needs are
# imported first, then the peak RSS is reset (``clear_refs``: importing them peaks above what they
# keep), so the peak read at exit is what the run itself added.
CLI = """
import atexit, os, sys
import torch, torchvision, accelerate, safetensors, inspect_model.cli.app
from inspect_model.loading import hub_weights
hub_weights.expected_prefix = lambda p: {prefix!r}

def kib(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field))

with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")
start = kib("VmRSS:")
atexit.register(lambda: open(os.environ["PEAK_FILE"], "w").write(str((kib("VmHWM:") - start) * 1024)))
sys.argv = ["inspect-model"] + sys.argv[1:]
from inspect_model.cli.launch import main
main()
"""


def run_peak(env: dict, *args: str) -> dict:
    peak = os.path.join(env["TORCH_HOME"], "peak")
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900,
                       env=dict(env, PEAK_FILE=peak))
    with open(peak, encoding="ascii") as fh:
        return {"rc": r.returncode, "peak": int(fh.read()), "stdout": r.stdout, "stderr": r.stderr[-3000:]}


@pytest.mark.slow
def test_offloaded_pretrained_weights_hold_about_one_block(tmp_path):
    import torchvision
    from torchvision.models import ResNet50_Weights

    from inspect_model.loading import hub_weights
    from inspect_model.loading.sources.torchvision import weights_cache_path

    env = dict(os.environ, TORCH_HOME=str(tmp_path / "th"))
    os.environ["TORCH_HOME"], old = env["TORCH_HOME"], os.environ.get("TORCH_HOME")
    try:
        path = weights_cache_path(ResNet50_Weights.DEFAULT)
    finally:
        if old is None:
            del os.environ["TORCH_HOME"]
        else:
            os.environ["TORCH_HOME"] = old
    os.makedirs(os.path.dirname(path))
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    total = sum(p.numel() * 4 for p in model.parameters())
    block = sum(p.numel() * 4 for p in model.layer4[0].parameters())
    torch.save(model.state_dict(), path)
    del model
    cli = CLI.format(prefix=hub_weights.sha256_file(path)[:8])
    command = ["-c", cli, "activations", "resnet50", "--input-size", "3x64x64", "--json", "-q"]
    runs = {name: run_peak(env, *command, *extra) for name, extra in (
        ("random offloaded", ["--weights", "none", "--offload"]),
        ("pretrained offloaded", ["--weights", "DEFAULT", "--offload"]),
        ("pretrained resident", ["--weights", "DEFAULT"]))}
    for name, run in runs.items():
        assert run["rc"] == 0, (name, run["stderr"])
    placed, resident = (json.loads(runs[n]["stdout"]) for n in ("pretrained offloaded", "pretrained resident"))
    assert set(placed["options"]["placement"].values()) == {"disk"}
    assert json.dumps(placed["layers"], sort_keys=True) == json.dumps(resident["layers"], sort_keys=True)
    grew = {name: run["peak"] for name, run in runs.items()}
    print(f"\nresnet50 ({total / 1e6:.0f} MB, block {block / 1e6:.0f} MB), peak RSS above the imports: "
          + "; ".join(f"{name} {n / 1e6:.0f} MB" for name, n in grew.items()))
    extra = grew["pretrained offloaded"] - grew["random offloaded"]
    assert extra < block, f"pretrained offloaded grew {extra / 1e6:.0f} MB over random, a block is {block / 1e6:.0f} MB"
    assert grew["pretrained resident"] > total  # the measure can tell the two apart
