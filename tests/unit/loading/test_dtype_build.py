"""``--dtype`` builds the model in that dtype directly, for every source (issue 37): no
float32 copy first, so the build's peak memory is the weights in that dtype."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from inspect_model.loading.sources import building_in, load_model
from inspect_model.run.options import ModelOptions, load


def _float_dtypes(model) -> set:
    return {p.dtype for p in model.parameters() if p.is_floating_point()}


def test_building_in_sets_and_restores_the_default_dtype():
    with building_in("bfloat16"):
        layer = torch.nn.Linear(3, 4)
        assert torch.get_default_dtype() == torch.bfloat16
    assert layer.weight.dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32
    with pytest.raises(RuntimeError), building_in("float16"):
        raise RuntimeError("boom")
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("spec", ["resnet18", "timm:resnet18"])
def test_registry_models_are_built_in_bfloat16(spec):
    if spec.startswith("timm"):
        pytest.importorskip("timm")
    seen: list = []
    original = torch.nn.Parameter.__new__

    def spy(cls, data=None, requires_grad=True):  # every parameter as it is made
        seen.append(None if data is None else data.dtype)
        return original(cls, data, requires_grad)

    torch.nn.Parameter.__new__ = spy
    try:
        loaded = load(ModelOptions(spec, weights="none", dtype="bfloat16"))
    finally:
        torch.nn.Parameter.__new__ = original
    assert _float_dtypes(loaded.model) == {torch.bfloat16}
    assert seen and torch.float32 not in seen  # never a float32 parameter, not even for a moment


def test_user_file_and_checkpoint_in_float16(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    """))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ckpt = tmp_path / "w.pt"
    torch.save(ref.state_dict(), ckpt)
    loaded = load_model(f"{src}:build", dtype="float16", checkpoint=str(ckpt), trust_checkpoint=False)
    assert _float_dtypes(loaded.model) == {torch.float16}
    assert torch.equal(loaded.model[0].weight, ref[0].weight.half())  # the checkpoint, rounded once


def test_hugging_face_config_in_bfloat16(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=48, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    loaded = load(ModelOptions(str(tmp_path), weights="none", dtype="bfloat16"))
    assert _float_dtypes(loaded.model) == {torch.bfloat16}


PEAK = """
import resource, subprocess, sys
r = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, r.stdout.strip() or 0)
if r.returncode:
    print(r.stderr[-2000:], file=sys.stderr)
"""
IMPORTS = ("import torch, transformers, accelerate, transformers.models.llama.modeling_llama; "
           "import inspect_model.run.options; ")


def peak_rss(code: str) -> tuple[int, int]:
    """Peak RSS in bytes of ``python -c code``, read with getrusage by its parent, and the
    number ``code`` printed."""
    r = subprocess.run([sys.executable, "-c", PEAK, code], capture_output=True, text=True, timeout=900)
    rc, peak, printed = r.stdout.split()
    assert rc == "0", r.stderr
    return int(peak), int(printed)


@pytest.mark.slow
def test_a_275m_llama_config_builds_in_bfloat16_within_its_weights(tmp_path):
    """A Llama-shaped config of 276 M parameters (0.55 GB in bfloat16; the 1B shape took four
    times as long to prove the same): the build's peak RSS above the bare imports stays within
    1.2x of the bfloat16 weights (measured 0.90x; in float32 first it would be 2x and more,
    measured 2.02x)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                             num_key_value_heads=4, intermediate_size=4096, tie_word_embeddings=True,
                             architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    base, _ = peak_rss(IMPORTS)
    build = (IMPORTS + "from inspect_model.run.options import ModelOptions, load; "
             f"m = load(ModelOptions({str(tmp_path)!r}, weights='none', dtype='bfloat16')).model; "
             "assert {p.dtype for p in m.parameters()} == {torch.bfloat16}; "
             "print(sum(p.numel() * p.element_size() for p in m.parameters()))")
    peak, weights = peak_rss(build)
    assert weights >= 2 * 276_000_000  # 276 M parameters (tied embeddings counted once)
    grown = peak - base
    print(f"276M bf16 build: peak RSS grew {grown / 1e9:.3f} GB, weights {weights / 1e9:.3f} GB, "
          f"ratio {grown / weights:.3f}")
    assert grown <= 1.2 * weights, f"peak RSS grew {grown / 1e9:.2f} GB for {weights / 1e9:.2f} GB of weights"
