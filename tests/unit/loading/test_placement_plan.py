"""Placement planning (issue 37): the option syntax, and the device table accelerate plans,
tested on the CPU with a fake device plan (GPU indices given budgets; none is touched).

Pipeline placement: the blocks of a model, in order, fill GPU 0, then GPU 1, then the CPU,
then the disk; what goes to the disk is split into one entry per block.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inspect_model.errors import UsageError
from inspect_model.loading.placement import (
    Placement,
    describe,
    main_device,
    parse_max_memory,
    parse_size,
)


def test_sizes_and_max_memory_parse():
    assert parse_size("60MB") == 60_000_000
    assert parse_size("20GiB") == 20 * 2**30
    assert parse_size("1.5gb") == 1_500_000_000
    assert parse_size("1000") == 1000
    assert parse_max_memory("0=20GiB, 1=10GiB,cpu=30GiB") == {0: 20 * 2**30, 1: 10 * 2**30, "cpu": 30 * 2**30}
    assert parse_max_memory("cuda:1=1GB") == {1: 10**9}
    assert parse_max_memory(None) is None


@pytest.mark.parametrize("text, needle", [("cpu", "DEVICE=SIZE"), ("gpu=1GB", "device 'gpu'"),
                                          ("cpu=lots", "'lots' is not a size")])
def test_bad_max_memory_is_a_usage_error(text, needle):
    with pytest.raises(UsageError, match=needle):
        parse_max_memory(text)


def test_device_map_must_be_a_kind_or_a_file(tmp_path):
    with pytest.raises(UsageError, match="not one of auto, balanced"):
        Placement(device_map="everywhere").check()
    Placement(device_map="auto").check()
    assert not Placement().active and Placement(offload=True).active and Placement(offload_dir="x").active


def test_cli_rejects_bad_placement_options_at_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "inspect_model", "activations", "resnet18", "--max-memory", "cpu=lots"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == ("error: --max-memory: 'lots' is not a size such as 20GiB, "
                                                      "500MB or 1000000")


def test_main_device_and_description():
    table = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.layers.2": "cpu",
             "model.layers.3": "disk", "model.layers.4": "disk", "lm_head": "disk"}
    assert main_device(table) == "cuda:0"
    assert main_device({"a": "cpu", "b": "disk"}) == "cpu"
    assert describe(table) == ("model.embed_tokens: cuda:0; model.layers.0: cuda:0; model.layers.1: cuda:1; "
                               "model.layers.2: cpu; model.layers.3-4: disk; lm_head: disk")


# ----------------------------------------------------------------------------- the fake device plan
@pytest.fixture(scope="module")
def empty_llama():
    """An 8-block Llama built empty (nothing allocated), and the bytes of one block."""
    pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    from accelerate import init_empty_weights

    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                                   num_key_value_heads=4, intermediate_size=128, tie_word_embeddings=False)
    with init_empty_weights():
        model = transformers.LlamaForCausalLM(cfg)
    block = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    return model, block


def _order(table: dict) -> list:
    """Devices of the decoder blocks, in block order."""
    return [table[f"model.layers.{i}"] for i in range(8)]


def test_blocks_fill_gpus_in_order_then_cpu_then_disk(empty_llama):
    import torch

    from inspect_model.loading.placement import plan_device_map

    model, block = empty_llama
    # GPU 0 holds about 3 blocks, GPU 1 about 3, the CPU 1, the rest goes to the disk.
    budget = f"0={int(3.5 * block)},1={int(3.5 * block)},cpu={int(1.5 * block)}"
    table = plan_device_map(model, Placement(device_map="auto", max_memory=budget, offload=True), torch.float32)
    order = _order(table)
    rank = {0: 0, 1: 1, "cpu": 2, "disk": 3}
    assert [rank[d] for d in order] == sorted(rank[d] for d in order), order  # pipeline: never back
    assert order.count(0) >= 2 and order.count(1) >= 2 and "disk" in order, order
    assert set(table.values()) >= {0, 1, "disk"}
    assert main_device(table) == "cuda:0"
    # Every parameter is placed exactly once.
    for name, _ in model.named_parameters():
        assert sum(name == k or name.startswith(k + ".") for k in table) == 1, name


def test_balanced_spreads_blocks_evenly(empty_llama):
    import torch

    from inspect_model.loading.placement import plan_device_map

    model, block = empty_llama
    big = str(100 * block)
    table = plan_device_map(model, Placement(device_map="balanced", max_memory=f"0={big},1={big},cpu={big}"),
                            torch.float32)
    order = _order(table)
    assert 3 <= order.count(0) <= 5 and 3 <= order.count(1) <= 5, order
    assert order == sorted(order, key=str), order


def test_offload_alone_streams_every_block_from_disk(empty_llama):
    import torch

    from inspect_model.loading.placement import plan_device_map

    model, _ = empty_llama
    table = plan_device_map(model, Placement(offload=True), torch.float32, free={"cpu": 10**12})
    assert set(table.values()) == {"disk"}
    assert [k for k in table if k.startswith("model.layers.")] == [f"model.layers.{i}" for i in range(8)]


def test_device_map_file_is_checked_against_the_model(empty_llama, tmp_path):
    import torch

    from inspect_model.loading.placement import plan_device_map

    model, _ = empty_llama
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"model.layer.0": 0}))
    with pytest.raises(UsageError, match="no module 'model.layer.0'; did you mean 'model.layers.0'"):
        plan_device_map(model, Placement(device_map=str(path)), torch.float32)
    path.write_text(json.dumps({"model": "cpu"}))
    with pytest.raises(UsageError, match="parameter 'lm_head.weight' is on no device"):
        plan_device_map(model, Placement(device_map=str(path)), torch.float32)
    path.write_text(json.dumps({"model": "cuda:1", "lm_head": "disk"}))
    assert plan_device_map(model, Placement(device_map=str(path)), torch.float32) == {"model": 1, "lm_head": "disk"}
    path.write_text(json.dumps({"model": "tpu", "lm_head": "cpu"}))
    with pytest.raises(UsageError, match="device 'tpu' of 'model'"):
        plan_device_map(model, Placement(device_map=str(path)), torch.float32)
