"""An offloaded run holds about one block in memory (issue 37, second check).

A Llama of about 208 MB (float32; four decoder blocks of 51 MB) is saved as safetensors and
run by the CLI with ``--max-memory cpu=60MB --offload``: at most one block stays in RAM and
the others stream from the shard, memory-mapped, one block per call. The peak RSS of that
process, read with ``getrusage`` by its parent, may grow above a process that only imports
the same modules by less than 3x the largest block.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

PEAK = """
import resource, subprocess, sys
r = subprocess.run([sys.executable] + sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
                  "stdout": r.stdout, "stderr": r.stderr[-3000:]}))
""".replace("import resource", "import json, resource")
IMPORTS = ("import torch, transformers, accelerate, safetensors, transformers.models.llama.modeling_llama; "
           "import inspect_model.cli.app")


def run_peak(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, timeout=900)
    return json.loads(r.stdout)


@pytest.mark.slow
def test_offloaded_run_holds_about_one_block(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=8, intermediate_size=2816, tie_word_embeddings=False,
                                   architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    block = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    total = sum(p.numel() * 4 for p in model.parameters())
    assert 190e6 < total < 230e6 and block > 50e6
    model.save_pretrained(tmp_path)
    del model
    base = run_peak("-c", IMPORTS)
    assert base["rc"] == 0, base["stderr"]
    run = run_peak("-m", "inspect_model", "activations", str(tmp_path), "--input-size", "input_ids=16:int64:0-256",
                   "--max-memory", "cpu=60MB", "--offload", "--json", "-q")
    assert run["rc"] == 0, run["stderr"]
    doc = json.loads(run["stdout"])
    placement = doc["options"]["placement"]
    assert "disk" in placement.values() and len(doc["layers"]) > 20
    grown = run["peak"] - base["peak"]
    print(f"offloaded 208 MB model: peak RSS grew {grown / 1e6:.0f} MB; largest block {block / 1e6:.0f} MB; "
          f"ratio {grown / block:.2f}")
    assert grown < 3 * block, f"peak RSS grew {grown / 1e6:.0f} MB, the largest block is {block / 1e6:.0f} MB"
    assert grown < 1.5 * block  # the issue asks for 3x; measured 45-49 MB (0.9 of a block)

    # The same config without weights: initialised one block at a time, each written to the
    # offload folder before the next is made.
    bare = tmp_path / "config-only"
    bare.mkdir()
    (bare / "config.json").write_text((tmp_path / "config.json").read_text())
    run = run_peak("-m", "inspect_model", "activations", str(bare), "--weights", "none", "--input-size",
                   "input_ids=16:int64:0-256", "--offload", "--json", "-q")
    assert run["rc"] == 0, run["stderr"]
    assert set(json.loads(run["stdout"])["options"]["placement"].values()) == {"disk"}
    grown = run["peak"] - base["peak"]
    print(f"random 208 MB model, --weights none --offload: peak RSS grew {grown / 1e6:.0f} MB")
    # Measured 154-184 MB before glibc was told to give freed blocks back (loading/blockwise.py:
    # return_freed_memory); 45 MB (0.88 of a block) since.
    assert grown < 1.5 * block, f"peak RSS grew {grown / 1e6:.0f} MB, the largest block is {block / 1e6:.0f} MB"
