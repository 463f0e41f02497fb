"""The language-model anatomy (methods/lm/anatomy.py) on tiny models of every family (issue 36):
blocks, attention, output projection, MLP, final norm, unembedding and scalings found from the
model, checked by the readout of the last block reproducing the model's own logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixtures.lm_models import KINDS, build_lm
from inspect_model.errors import LayerSelectionError, UnsupportedModelError
from inspect_model.methods.lm.anatomy import find_anatomy, readout

EXPECTED = {  # kind: (first block, attention, out projection, mlp, final norm)
    "gpt2": ("transformer.h.0", "attn", "attn.c_proj", "mlp", "transformer.ln_f"),
    "llama": ("model.layers.0", "self_attn", "self_attn.o_proj", "mlp", "model.norm"),
    "qwen2": ("model.layers.0", "self_attn", "self_attn.o_proj", "mlp", "model.norm"),
    "mistral": ("model.layers.0", "self_attn", "self_attn.o_proj", "mlp", "model.norm"),
    "gemma": ("model.layers.0", "self_attn", "self_attn.o_proj", "mlp", "model.norm"),
    "gemma2": ("model.layers.0", "self_attn", "self_attn.o_proj", "mlp", "model.norm"),
    "phi": ("model.layers.0", "self_attn", "self_attn.dense", "mlp", "model.final_layernorm"),
    "gptneox": ("gpt_neox.layers.0", "attention", "attention.dense", "mlp", "gpt_neox.final_layer_norm"),
    "opt": ("model.decoder.layers.0", "self_attn", "self_attn.out_proj", "fc2", "model.decoder.final_layer_norm"),
    "bart": ("model.decoder.layers.0", "self_attn", "self_attn.out_proj", "fc2", None),
    "t5": ("decoder.block.0", "layer.0.SelfAttention", "layer.0.SelfAttention.o", "layer.2.DenseReluDense",
           "decoder.final_layer_norm"),
}


def _last_block_logits(model, anatomy):
    ids = torch.tensor([[3, 5, 7, 9, 11, 4]])
    kw = {"decoder_input_ids": ids} if anatomy.encoder_decoder else {}
    seen = {}

    def grab(_m, _i, out):
        seen["h"] = out[0] if isinstance(out, tuple) else out

    handle = model.get_submodule(anatomy.blocks[-1].name).register_forward_hook(grab)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, **kw).logits
    finally:
        handle.remove()
    with torch.no_grad():
        return readout(model, anatomy, seen["h"]), logits


@pytest.mark.parametrize("kind", KINDS)
def test_anatomy_of_each_family(kind):
    model = build_lm(kind)
    a = find_anatomy(model)
    block, attn, proj, mlp, norm = EXPECTED[kind]
    assert a.blocks[0] == type(a.blocks[0])(block, f"{block}.{attn}", f"{block}.{proj}", f"{block}.{mlp}")
    assert len(a.blocks) == 3 and a.block_names[-1] == block[:-1] + "2"
    assert a.final_norm == norm and a.unembed == "lm_head"
    assert (a.num_heads, a.head_dim) == (4, 8)
    assert a.encoder_decoder == (kind in ("t5", "bart"))
    assert "lm_head" in a.describe() and (norm or "no final norm") in a.describe()
    ours, theirs = _last_block_logits(model, a)
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_scalings_found_where_the_model_applies_them():
    assert find_anatomy(build_lm("t5")).hidden_scale == pytest.approx(32 ** -0.5)  # tied embeddings
    assert find_anatomy(build_lm("gemma2")).softcap == 3.0
    assert find_anatomy(build_lm("bart")).logit_bias == "final_logits_bias"
    plain = find_anatomy(build_lm("llama"))
    assert (plain.hidden_scale, plain.softcap, plain.logit_bias, plain.logit_scale) == (1.0, None, None, 1.0)


class _TwoNorms(nn.Module):
    """A user model: the norms outside its blocks run embed-norm first, then the final one;
    registered in the other order, so only the forward-order probe tells them apart."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.norm_out = nn.LayerNorm(8)
        self.pre = nn.LayerNorm(8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(8, 16)

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids):
        h = self.pre(self.emb(input_ids))
        for b in self.blocks:
            h = h + b(h)
        return self.head(self.norm_out(h))


def test_user_model_norm_by_forward_order_and_given_names():
    torch.manual_seed(0)
    model = _TwoNorms()
    a = find_anatomy(model)
    assert a.block_names == ("blocks.0", "blocks.1", "blocks.2")
    assert (a.final_norm, a.unembed) == ("norm_out", "head") and "after the last block" in a.how
    assert a.blocks[0].attention is None and a.num_heads is None
    given = find_anatomy(model, final_norm="pre", unembed="head")
    assert (given.final_norm, given.how) == ("pre", "given")
    assert find_anatomy(model, final_norm="").final_norm is None
    with pytest.raises(LayerSelectionError, match="--final-norm 'norm_ou': the model has no such module; did you mean 'norm_out'"):
        find_anatomy(model, final_norm="norm_ou")


def test_unsupported_models_say_so_in_one_line():
    class NoHead(_TwoNorms):
        def get_output_embeddings(self):
            return None

    with pytest.raises(UnsupportedModelError, match="no output embedding"):
        find_anatomy(NoHead())
    with pytest.raises(UnsupportedModelError, match="no output embedding"):
        find_anatomy(nn.Sequential(nn.Conv2d(3, 4, 3)))

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 8)

        def get_output_embeddings(self):
            return self.head

    with pytest.raises(UnsupportedModelError, match="no list of transformer blocks"):
        find_anatomy(Flat())
    assert UnsupportedModelError("x").exit_code == 9


def test_no_hooks_left_after_the_probe():
    model = _TwoNorms()
    find_anatomy(model)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
