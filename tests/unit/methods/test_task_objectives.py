"""Task objectives checked against independent computations (issue 42): captum at a causal
LM's embedding output (GPT-2, Llama with GQA and RoPE), autograd of a T5's teacher-forced
log-probability, of a CLIP's logits_per_image[i, j] and of a head-less BertModel's pooled
norm. Models are tiny, built from configs offline (tests/fixtures/task_models.py)."""

from __future__ import annotations

import pytest
import torch

import inspect_model as im
from inspect_model.run.options import InputOptions
from inspect_model.errors import UsageError
from tests.fixtures.task_models import save_task_model

TEXT = "the cat sat on the"
IMAGE = "/work/shared/sample_images/cat.jpg"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("task_models")
    return {k: str(save_task_model(k, root / k)) for k in ("gpt2", "llama", "t5", "clip", "bertmodel")}


def _hf(folder):
    import transformers

    return transformers.AutoModel.from_pretrained(folder)


def _lm(folder):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval(), \
        transformers.AutoTokenizer.from_pretrained(folder)


def _per_token(m):
    return m.reshape(m.shape[-2], m.shape[-1]).sum(-1).double()


def _r(a, b):
    return float(torch.corrcoef(torch.stack([a.detach().double().flatten(), b.detach().double().flatten()]))[0, 1])


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_causal_lm_next_token_logit_matches_captum(folders, kind):
    from captum.attr import InputXGradient, IntegratedGradients, LayerIntegratedGradients, Saliency

    res = im.attributions(folders[kind], inputs=InputOptions(text=[TEXT]),
                          methods=["saliency", "input-x-gradient", "ig"], steps=32)
    model, tok = _lm(folders[kind])
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    emb = model.get_input_embeddings()(ids).detach()
    with torch.no_grad():
        token = int(model(ids).logits[0, -1].argmax())
    assert res.payload["images"][0]["targets"] == [token]  # the next token, an index into the vocabulary

    def f(e):
        return model(inputs_embeds=e).logits[:, -1, token]

    sal = Saliency(f).attribute(emb, abs=True)
    ixg = InputXGradient(f).attribute(emb)
    ig = IntegratedGradients(f).attribute(emb, baselines=torch.zeros_like(emb), n_steps=32, method="gausslegendre")
    for ours, theirs in (("saliency", sal), ("input-x-gradient", ixg), ("integrated-gradients", ig)):
        assert _r(_per_token(res.maps[ours]), theirs[0].sum(-1)) >= 0.999, ours
    # LayerIntegratedGradients at the embedding layer, the token ids' baseline the pad id: same ranking of tokens.
    lig = LayerIntegratedGradients(lambda i: model(i).logits[:, -1, token], model.get_input_embeddings())
    assert lig.attribute(ids, baselines=torch.zeros_like(ids), n_steps=32).shape == emb.shape


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_causal_lm_continuation_log_prob_matches_captum(folders, kind):
    from captum.attr import Saliency

    res = im.attributions(folders[kind], inputs=InputOptions(text=[TEXT], target_text=" mat"), methods=["gradient"])
    model, tok = _lm(folders[kind])
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    cont = tok(" mat", add_special_tokens=False)["input_ids"]
    full = torch.cat([ids, torch.tensor([cont])], dim=1)
    emb = model.get_input_embeddings()(full).detach()
    n = ids.shape[1]

    def f(e):
        logp = model(inputs_embeds=e).logits.log_softmax(-1)
        return sum(logp[:, n - 1 + j, t] for j, t in enumerate(cont))

    grad = Saliency(f).attribute(emb, abs=False)
    assert _r(_per_token(res.maps["gradient"]), grad[0].sum(-1)) >= 0.999
    assert torch.allclose(res.maps["gradient"].reshape(grad[0].shape).float(), grad[0], atol=1e-5)
    label = res.payload["images"][0]["maps"][0]["target"]["label"]
    assert label == f"log p(' mat' | text) at position {n}"


def test_t5_teacher_forced_log_prob_gradient(folders):
    import transformers

    res = im.grads(folders["t5"], inputs=InputOptions(text=["the cat sat"], target_text="on the mat"))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folders["t5"]).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folders["t5"])
    enc = tok(["the cat sat"], return_tensors="pt")
    labels = tok(["on the mat"], return_tensors="pt")["input_ids"]
    out = model(**enc, labels=labels)
    logp = -out.loss * labels.shape[1]  # the mean cross-entropy over B's tokens, summed back
    grads = torch.autograd.grad(logp, [p for p in model.parameters()], allow_unused=True)
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    assert res.record.global_norm == pytest.approx(norm, rel=1e-4)
    assert "log p('on the mat' | text)" in res.record.objective


def test_clip_attributions_differentiate_logits_per_image(folders):
    import transformers

    res = im.attributions(folders["clip"], IMAGE, inputs=InputOptions(images=[IMAGE], text=["a cat", "a dog"]),
                          methods=["gradient"], target="1")
    model = transformers.CLIPModel.from_pretrained(folders["clip"]).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folders["clip"])
    from inspect_model.run.options import ModelOptions
    from inspect_model.run.pipeline import prepare

    prep = prepare("attributions", ModelOptions(folders["clip"]), InputOptions(images=[IMAGE], text=["a cat"]))
    x = next(iter(prep.plan.batches())).tensor.clone().requires_grad_(True)
    enc = tok(["a cat", "a dog"], padding=True, return_tensors="pt")
    model(pixel_values=x, **enc).logits_per_image[0, 1].backward()
    assert torch.allclose(res.maps["gradient"][0, 0].float(), x.grad[0], atol=1e-6, rtol=1e-4)


def test_headless_needs_an_objective_and_norm_is_the_pooled_norm(folders):
    with pytest.raises(UsageError, match="--target norm"):
        im.grads(folders["bertmodel"], inputs=InputOptions(text=["the cat sat"]))
    res = im.grads(folders["bertmodel"], inputs=InputOptions(text=["the cat sat"]), target="norm")
    import transformers

    model = transformers.BertModel.from_pretrained(folders["bertmodel"]).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folders["bertmodel"])
    norm = model(**tok(["the cat sat"], return_tensors="pt")).pooler_output.norm()
    grads = torch.autograd.grad(norm, list(model.parameters()), allow_unused=True)
    total = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    assert res.record.global_norm == pytest.approx(total, rel=1e-4)
    assert "||the pooled output||_2" in res.record.objective


def test_causal_lm_input_size_explains_the_last_position_not_a_flat_index(folders):
    res = im.grads(folders["gpt2"], inputs=InputOptions(input_size=["input_ids=8:int64:4-30"]))
    assert "next-token logits at each input's last token" in res.record.objective
    assert all(0 <= t < 64 for t in res.record.samples[0].targets)  # a token of the vocabulary of 64
