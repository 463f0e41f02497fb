"""The preflight (issue 37): a model that cannot fit is refused before any weight is
allocated, in one line with the numbers and the ways out, within seconds; checks that need
only the config come before any build."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from inspect_model.errors import ModelLoadError  # noqa: E402
from inspect_model.loading.preflight import Estimate, check_fits, check_placed, estimate, free_ram  # noqa: E402


def _save_config(folder, **kw):
    base = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=96, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    base.update(kw)
    transformers.LlamaConfig(**base).save_pretrained(folder)
    return str(folder)


def llama_params(v: int, h: int, layers: int, inter: int, kv_heads: int, heads: int) -> int:
    """Parameters of an untied Llama, counted from its shapes by hand."""
    kv = h // heads * kv_heads
    attn = h * h * 2 + h * kv * 2  # q, o; k, v
    mlp = 3 * h * inter
    return 2 * v * h + layers * (attn + mlp + 2 * h) + h


def test_estimate_counts_the_weights_in_the_dtype_asked_for(tmp_path):
    import torch

    from inspect_model.loading.sources import load_model

    folder = _save_config(tmp_path)
    loaded = load_model(folder, weights="none", device="meta")
    n = llama_params(128, 64, 2, 96, 2, 4)
    est = estimate(loaded.model, torch.bfloat16)
    buffers = sum(b.numel() * 2 for b in loaded.model.buffers())  # the rotary table
    assert est.weights == 2 * n + buffers
    assert estimate(loaded.model, torch.float32).weights == 4 * n + 2 * buffers
    block = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 96 + 2 * 64
    assert est.largest_block == 2 * block and est.dtype == "bfloat16"


def test_check_fits_names_the_numbers():
    est = Estimate(weights=16_100_000_000, largest_block=10**9, activations=0, dtype="bfloat16")
    check_fits(est, "cpu", name="m", free={"cpu": 20 * 10**9})
    with pytest.raises(ModelLoadError) as info:
        check_fits(est, "cpu", name="llama8b", free={"cpu": 11_200_000_000})
    assert str(info.value) == ("llama8b needs 16.1 GB in bfloat16 (weights 16.1 GB); 11.2 GB free in RAM; use "
                               "--offload, --max-memory, or a smaller --dtype (bfloat16 halves float32)")
    with pytest.raises(ModelLoadError, match="free on GPU 1"):
        check_fits(est, "cuda:1", name="m", free={0: 10**12, 1: 10**9, "cpu": 10**12})


def test_a_placement_must_fit_too(tmp_path):
    import torch

    from inspect_model.loading.sources import load_model

    loaded = load_model(_save_config(tmp_path), weights="none", device="meta")
    est = estimate(loaded.model, torch.float32)
    table = {"model": "cpu", "lm_head": "disk"}
    check_placed(est, table, loaded.model, name="m", free={"cpu": 10**9})
    with pytest.raises(ModelLoadError, match="the placement keeps .* in RAM"):
        check_placed(est, table, loaded.model, name="m", free={"cpu": 1000})


def test_free_ram_obeys_an_address_space_limit():
    code = ("import resource; from inspect_model.loading.preflight import free_ram, _virtual_size; "
            "resource.setrlimit(resource.RLIMIT_AS, (_virtual_size() + 2**30, resource.RLIM_INFINITY)); "
            "print(free_ram())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) <= 2**30
    assert free_ram() is None or free_ram() > 0


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_too_large_config_is_refused_in_seconds(tmp_path):
    """Weights of about 275 GB in float32: more than any machine this runs on has free."""
    folder = _save_config(tmp_path, vocab_size=4_000_000, hidden_size=8192, num_hidden_layers=4,
                          num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672)
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-m", "inspect_model", "activations", folder, "--weights", "none",
                        "--input-size", "input_ids=16:int64:0-1000"], capture_output=True, text=True, timeout=120)
    wall, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the run (interpreter, imports, config, empty build): on a machine shared
    # by several jobs the wall clock also counts the others' turns.
    took = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {folder} needs ") and "GB in float32 (weights 27" in lines[0]
    assert " free in RAM; use --offload, --max-memory, or a smaller --dtype" in lines[0]
    assert took < 15, f"the refusal took {took:.1f} s of CPU ({wall:.1f} s wall)"
    assert wall < 120


def test_missing_tokenizer_is_found_before_any_build(tmp_path):
    folder = _save_config(tmp_path, vocab_size=4_000_000, hidden_size=8192, num_hidden_layers=4,
                          num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672)
    code = ("import sys; from inspect_model.cli.launch import main; sys.argv = ['inspect-model', 'activations', "
            f"{folder!r}, '--weights', 'none', '--text', 'hello'];\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('torch' in sys.modules, e.code)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.stderr.strip() == (f"error: --text needs a tokenizer, and {folder} has none in its folder; give "
                                "--tokenizer DIR (a folder written by tokenizer.save_pretrained)")
    assert r.stdout.split() == ["False", "4"]  # torch was never imported: nothing was built
