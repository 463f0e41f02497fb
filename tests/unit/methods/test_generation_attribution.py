"""Attribution over a generation (issue 36, item 3), against independent computations:
captum's LayerIntegratedGradients and LayerGradientXActivation on the embedding layer for
each generated token (same steps, rule and baseline), ``model.generate(do_sample=False)``'s
tokens, teacher-forced rows, occlusion by hand through ``inputs_embeds``, and the model
given back as it was. Tiny GPT-2, Llama (GQA, RoPE), Qwen2 and T5 built offline."""

from __future__ import annotations

import pytest
import torch

from fixtures.task_models import build
from fixtures.text_models import build_model
from inspect_model.methods.attributions.generation import GenerationSettings, attribute_generation

captum_attr = pytest.importorskip("captum.attr")

PROMPT = [5, 7, 9, 11, 4]


def qwen2():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                   eos_token_id=2, bos_token_id=1)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def model_of(kind: str):
    m = qwen2() if kind == "qwen2" else build("t5") if kind == "t5" else build_model(kind)
    with torch.no_grad():  # token 0's embedding is the zero vector: captum's baseline ids 0 = our zero baseline
        m.get_input_embeddings().weight[0].zero_()
        if kind == "t5":
            m.get_decoder().get_input_embeddings().weight[0].zero_()
    return m


def _logp(m, kind: str, ids: list[int], before: list[int]):
    """f and its captum inputs for one row: log p(next | prefix), by the model's own call."""
    if kind == "t5":
        enc = torch.tensor([ids])
        dec = torch.tensor([[0, *before]])
        return (enc, dec), lambda e, d, t: m(input_ids=e, decoder_input_ids=d).logits[:, -1].log_softmax(-1)[:, t]
    x = torch.tensor([ids + before])
    return (x,), lambda a, t: m(input_ids=a).logits[:, -1].log_softmax(-1)[:, t]


def _layers(m, kind: str):
    if kind == "t5":
        return [m.get_encoder().get_input_embeddings(), m.get_decoder().get_input_embeddings()]
    return m.get_input_embeddings()


def _row(att) -> torch.Tensor:
    parts = att if isinstance(att, (list, tuple)) else [att]
    return torch.cat([a.detach().double().sum(-1)[0] for a in parts])


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", pytest.param("t5", marks=pytest.mark.slow)])
def test_rows_equal_captum_layer_integrated_gradients(kind):
    m = model_of(kind)
    st = GenerationSettings(methods=("integrated-gradients", "input-x-gradient", "saliency"), new_tokens=3,
                            steps=16, batch_size=16)
    res = attribute_generation(m, PROMPT, st)
    assert len(res.generated) >= 1
    for t, tok in enumerate(res.generated):
        inputs, f = _logp(m, kind, PROMPT, res.generated[:t])
        fwd = (lambda *a, t=tok, f=f: f(*a, t))
        lig = captum_attr.LayerIntegratedGradients(fwd, _layers(m, kind))
        base = tuple(torch.zeros_like(i) for i in inputs)
        ref = _row(lig.attribute(inputs if len(inputs) > 1 else inputs[0], baselines=base if len(base) > 1 else base[0],
                                 n_steps=16, method="gausslegendre", internal_batch_size=16))
        n = res.first + t
        ours = res.matrices["integrated-gradients"][t, :n]
        assert ref.shape == ours.shape
        assert _corr(ref, ours) >= 0.999
        assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-4)
        assert torch.isnan(res.matrices["integrated-gradients"][t, n:]).all()  # past the row's prefix: empty
        gxa = captum_attr.LayerGradientXActivation(fwd, _layers(m, kind))
        ixg = _row(gxa.attribute(inputs if len(inputs) > 1 else inputs[0]))
        assert torch.allclose(res.matrices["input-x-gradient"][t, :n], ixg, atol=1e-5, rtol=1e-4)
        grad = captum_attr.LayerGradientXActivation(fwd, _layers(m, kind), multiply_by_inputs=False)
        g = grad.attribute(inputs if len(inputs) > 1 else inputs[0])
        sal = torch.cat([a.detach().double().abs().sum(-1)[0] for a in (g if isinstance(g, (list, tuple)) else [g])])
        assert torch.allclose(res.matrices["saliency"][t, :n], sal, atol=1e-5, rtol=1e-4)
        # the completeness gap is the row's sum against f(x) - f(baseline), both recomputed here
        with torch.no_grad():
            fx = float(fwd(*inputs))
        assert res.scores[t] == pytest.approx(fx, abs=1e-5)
        assert res.gaps[t] == pytest.approx(float(ours.sum()) - (fx - res.baseline_scores[t]), abs=1e-9)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "t5"])
def test_greedy_tokens_equal_generate(kind):
    m = model_of(kind)
    res = attribute_generation(m, PROMPT, GenerationSettings(methods=("saliency",), new_tokens=6))
    with torch.no_grad():
        out = m.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False)
    ref = out[0, 1:].tolist() if kind == "t5" else out[0, len(PROMPT):].tolist()
    assert res.generated == ref
    assert res.mode == "greedy"


def test_continuation_rows_equal_the_greedy_rows_and_teacher_forcing():
    m = model_of("gpt2")
    st = GenerationSettings(methods=("integrated-gradients", "saliency"), new_tokens=5, steps=8)
    greedy = attribute_generation(m, PROMPT, st)
    forced = attribute_generation(m, PROMPT, GenerationSettings(methods=st.methods, continuation=tuple(greedy.generated),
                                                                steps=8))
    assert forced.mode == "continuation" and forced.generated == greedy.generated
    for name in st.methods:
        assert torch.allclose(forced.matrices[name], greedy.matrices[name], equal_nan=True, atol=1e-9)
    # a continuation the model would not write: each row is that prefix's own attribution
    cont = (3, 30, 12)
    got = attribute_generation(m, PROMPT, GenerationSettings(methods=("saliency",), continuation=cont))
    for t in range(len(cont)):
        one = attribute_generation(m, PROMPT + list(cont[:t]), GenerationSettings(methods=("saliency",),
                                                                                continuation=(cont[t],)))
        n = len(PROMPT) + t
        assert torch.allclose(got.matrices["saliency"][t, :n], one.matrices["saliency"][0, :n], atol=1e-9)


def test_contrast_rows_explain_the_log_probability_difference():
    m = model_of("gpt2")
    contrast = 8
    res = attribute_generation(m, PROMPT, GenerationSettings(methods=("integrated-gradients",), new_tokens=3,
                                                             contrast=contrast, steps=16, batch_size=16))
    for t, tok in enumerate(res.generated):
        x = torch.tensor([PROMPT + res.generated[:t]])

        def f(a, t=tok):
            lp = m(input_ids=a).logits[:, -1].log_softmax(-1)
            return lp[:, t] - lp[:, contrast]

        ref = _row(captum_attr.LayerIntegratedGradients(f, m.get_input_embeddings()).attribute(
            x, baselines=torch.zeros_like(x), n_steps=16, method="gausslegendre"))
        ours = res.matrices["integrated-gradients"][t, :x.shape[1]]
        assert _corr(ref, ours) >= 0.999 and torch.allclose(ours, ref, atol=1e-5, rtol=1e-4)
        assert res.scores[t] == pytest.approx(res.log_probs[t] - res.contrast_log_probs[t], abs=1e-5)


def test_occlusion_cells_by_hand_through_inputs_embeds():
    m = model_of("llama")
    res = attribute_generation(m, PROMPT, GenerationSettings(methods=("occlusion",), new_tokens=2, batch_size=3))
    emb = m.get_input_embeddings()
    for t, tok in enumerate(res.generated):
        ids = torch.tensor([PROMPT + res.generated[:t]])
        with torch.no_grad():
            e = emb(ids)
            full = float(m(inputs_embeds=e).logits[0, -1].log_softmax(-1)[tok])
            for j in range(ids.shape[1]):
                z = e.clone()
                z[0, j] = 0
                cut = float(m(inputs_embeds=z).logits[0, -1].log_softmax(-1)[tok])
                assert float(res.matrices["occlusion"][t, j]) == pytest.approx(full - cut, abs=1e-5)


def test_model_given_back_as_it_was():
    m = model_of("gpt2").train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    flags = [p.requires_grad for p in m.parameters()]
    attribute_generation(m, PROMPT, GenerationSettings(methods=("integrated-gradients", "occlusion", "saliency"),
                                                       new_tokens=3, steps=4))
    assert m.training
    assert [p.requires_grad for p in m.parameters()] == flags
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())
    assert torch.is_grad_enabled()


def test_settings_refuse_methods_without_a_generation_rule():
    from inspect_model.errors import UsageError

    with pytest.raises(UsageError, match="smoothgrad is not one of them"):
        GenerationSettings(methods=("smoothgrad",))
