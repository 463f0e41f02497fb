"""A fine-tuned checkpoint of a user model, offloaded, holds about one block (issue 37).

A user model of four 50 MB blocks (200 MB in float32) is given as ``FILE.py:NAME`` with
``--checkpoint`` (a torch.save archive, read with ``weights_only=True`` and memory-mapped, or
a safetensors file) and ``--offload``: it is built empty, each block read from the
checkpoint, written to the offload folder and freed before the next, and streamed back one
block per call. The peak RSS of that process, read with ``getrusage`` by its parent, may grow
above a process that only imports the same modules by less than one block (measured 18 MB
with the torch file, 24 MB with safetensors); the resident run of the same command, printed
for comparison, grew 121 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

PEAK = """
import json, resource, subprocess, sys
r = subprocess.run([sys.executable] + sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
                  "stdout": r.stdout, "stderr": r.stderr[-3000:]}))
"""
IMPORTS = "import torch, torchvision, accelerate, safetensors; import inspect_model.cli.app"
NET = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up, self.mid, self.down = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.mid(torch.relu(self.up(x)))))


class Stack(nn.Module):
    def __init__(self, width=2048, blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(blocks)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
'''


def run_peak(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, timeout=900)
    return json.loads(r.stdout)


@pytest.mark.slow
def test_an_offloaded_checkpoint_holds_about_one_block(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "net.py").write_text(NET)
    namespace: dict = {}
    exec(compile(NET, "net.py", "exec"), namespace)  # the same classes the CLI builds from net.py
    torch.manual_seed(0)
    model = namespace["Stack"]()
    block = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    total = sum(p.numel() * 4 for p in model.parameters())
    assert 190e6 < total < 210e6 and block > 49e6
    torch.save({"state_dict": model.state_dict()}, tmp_path / "tuned.pt")
    save_file(model.state_dict(), tmp_path / "tuned.safetensors")
    del model
    base = run_peak("-c", IMPORTS)
    assert base["rc"] == 0, base["stderr"]
    spec = f"{tmp_path / 'net.py'}:Stack"
    command = ["-m", "inspect_model", "activations", spec, "--input-size", "2048", "--json", "-q"]
    resident = run_peak(*command, "--checkpoint", str(tmp_path / "tuned.pt"))
    assert resident["rc"] == 0, resident["stderr"]
    for name in ("tuned.pt", "tuned.safetensors"):
        run = run_peak(*command, "--checkpoint", str(tmp_path / name), "--offload")
        assert run["rc"] == 0, run["stderr"]
        doc = json.loads(run["stdout"])
        assert set(doc["options"]["placement"].values()) == {"disk"}
        assert json.dumps(doc["layers"], sort_keys=True) == json.dumps(json.loads(resident["stdout"])["layers"],
                                                                       sort_keys=True)
        grown = run["peak"] - base["peak"]
        print(f"{name} --offload: peak RSS grew {grown / 1e6:.0f} MB ({grown / block:.2f} blocks of "
              f"{block / 1e6:.0f} MB); resident grew {(resident['peak'] - base['peak']) / 1e6:.0f} MB")
        assert grown < block, f"peak RSS grew {grown / 1e6:.0f} MB, a block is {block / 1e6:.0f} MB"
