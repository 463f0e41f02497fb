"""Text models under ``attention`` (issue 26): captured probabilities, rollout, grad-rollout and
LeGrad of BERT, GPT-2 and Llama against independent computations.

The models run on ``sdpa`` (the default kernel); the reference is the same weights run with
``attn_implementation="eager", output_attentions=True``, differentiated by autograd where a
gradient is needed. The batch is padded (two texts of different lengths), so masks are in
play: padding keys, and a decoder's causal mask (masked future exactly 0)."""

from __future__ import annotations

import pytest
import torch

from fixtures.text_models import build_model

transformers = pytest.importorskip("transformers")

from inspect_model.methods.attention.maps import AttentionOptions
from inspect_model.methods.attention.text import compute_text_attention

KINDS = ("bert", "gpt2", "llama")


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0  # the second text has 5 tokens
    return ids, mask


def eager(kind: str, ids: torch.Tensor, mask: torch.Tensor):
    model = build_model(kind, "eager")
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    return model, out


def last_logits(kind: str, out, mask: torch.Tensor) -> torch.Tensor:
    if kind == "bert":
        return out.logits
    return out.logits[torch.arange(2), mask.sum(1) - 1]


@pytest.mark.parametrize("kind", KINDS)
def test_captured_probabilities_equal_eager_and_outputs_untouched(kind):
    ids, mask = batch()
    model = build_model(kind, "sdpa")
    assert model.config._attn_implementation == "sdpa"
    plain = model(input_ids=ids, attention_mask=mask).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opts = AttentionOptions(methods=("raw",), layers=("all",), heads="all")
    got = compute_text_attention(model, ids, mask, opts)
    _, ref = eager(kind, ids, mask)
    assert len(got.raw) == len(ref.attentions) == 2
    for p, a in zip(got.raw.values(), ref.attentions, strict=True):
        for b, n in enumerate(mask.sum(1).tolist()):
            assert torch.allclose(p[b, :, :n, :n], a[b, :, :n, :n], atol=1e-6)
            assert torch.all(p[b, :, :n, n:] == 0)  # padding keys get nothing
        if kind != "bert":  # causal: the masked future is exactly 0, as the model used it
            assert torch.all(p.triu(diagonal=1) == 0)
    assert got.causal == (kind != "bert")
    assert got.queries == ([0, 0] if kind == "bert" else [6, 4])  # [CLS], or a decoder's last real token
    again = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(plain, again)  # bit for bit
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def rollout_by_hand(attentions, mask: torch.Tensor) -> torch.Tensor:
    """Abnar & Zuidema 2020, written out: Â = 0.5 A + 0.5 I (heads averaged), rows renormalised,
    R = Â_L ... Â_1."""
    out = []
    for b in range(mask.shape[0]):
        r = None
        for a in attentions:
            m = a[b].mean(0).double()
            ahat = 0.5 * m + 0.5 * torch.eye(m.shape[0], dtype=torch.float64)
            ahat = ahat / ahat.sum(-1, keepdim=True)
            r = ahat if r is None else ahat @ r
        out.append(r)
    return torch.stack(out)


@pytest.mark.parametrize("kind", KINDS)
def test_rollout_equals_the_formula(kind):
    ids, mask = batch()
    got = compute_text_attention(build_model(kind, "sdpa"), ids, mask, AttentionOptions(methods=("rollout",)))
    _, ref = eager(kind, ids, mask)
    want = rollout_by_hand(ref.attentions, mask)
    for b, n in enumerate(mask.sum(1).tolist()):
        assert torch.allclose(got.matrices["rollout"][b, :n, :n].double(), want[b, :n, :n], atol=1e-5)
        q = got.queries[b]
        assert torch.allclose(got.values["rollout"][b, :n].double(), want[b, q, :n], atol=1e-5)


def eager_grads(kind: str, ids: torch.Tensor, mask: torch.Tensor, target: list[int]):
    model, out = eager(kind, ids, mask)
    score = last_logits(kind, out, mask).gather(1, torch.tensor(target).view(-1, 1)).sum()
    grads = torch.autograd.grad(score, out.attentions)
    return model, out, grads


@pytest.mark.parametrize("kind", KINDS)
def test_grad_rollout_equals_chefer(kind):
    ids, mask = batch()
    got = compute_text_attention(build_model(kind, "sdpa"), ids, mask, AttentionOptions(methods=("grad-rollout",)))
    _, out, grads = eager_grads(kind, ids, mask, got.targets)
    assert got.targets == last_logits(kind, out, mask).argmax(1).tolist()  # the predicted class / next token
    for b, n in enumerate(mask.sum(1).tolist()):
        r = torch.eye(7, dtype=torch.float64)
        for a, g in zip(out.attentions, grads, strict=True):  # Chefer et al. 2021, eq. 5-6
            abar = (g[b] * a[b]).clamp(min=0).mean(0).double()
            r = r + abar @ r
        # The gradient term beside the identity, compared on its own scale (a random BERT's is ~1e-5).
        want = (r - torch.eye(7, dtype=torch.float64))[:n, :n]
        have = got.matrices["grad-rollout"][b, :n, :n].double() - torch.eye(n, dtype=torch.float64)
        assert want.abs().max() > 1e-7
        assert torch.allclose(have, want, rtol=1e-3, atol=2.5e-7)  # float32 next to the 1 of the identity


def test_legrad_equals_the_formula_on_bert():
    """Per layer l: s^l = classifier(pooler(h^l)), ∂s^l/∂A^l by autograd on the eager model,
    positive part averaged over heads and the text's queries; averaged over layers."""
    ids, mask = batch()
    got = compute_text_attention(build_model("bert", "sdpa"), ids, mask, AttentionOptions(methods=("legrad",)))
    model, out = eager("bert", ids, mask)
    idx = torch.tensor(got.targets).view(-1, 1)
    total = 0
    for layer, a in enumerate(out.attentions):
        s = model.classifier(model.bert.pooler(out.hidden_states[layer + 1])).gather(1, idx).sum()
        g = torch.autograd.grad(s, a, retain_graph=True)[0]
        total = total + g.clamp(min=0).mean(1).sum(1) / mask.sum(1, keepdim=True)
    want = total / len(out.attentions)
    assert want.max() > 0
    for b, n in enumerate(mask.sum(1).tolist()):
        assert torch.allclose(got.values["legrad"][b, :n], want[b, :n], rtol=1e-4, atol=1e-9)


def test_queries_and_heads():
    from inspect_model.errors import UsageError

    ids, mask = batch()
    model = build_model("gpt2", "sdpa")
    got = compute_text_attention(model, ids, mask, AttentionOptions(methods=("rollout",), query="1"))
    assert got.queries == [1, 1]
    got = compute_text_attention(model, ids, mask, AttentionOptions(methods=("rollout",), query="-2"))
    assert got.queries == [5, 3]  # from the end of each text
    got = compute_text_attention(build_model("bert"), ids, mask, AttentionOptions(methods=("rollout",), query="last"))
    assert got.queries == [6, 4] and not got.causal
    with pytest.raises(UsageError, match="--query 9 is out of range"):
        compute_text_attention(model, ids, mask, AttentionOptions(methods=("rollout",), query="9"))
    with pytest.raises(UsageError, match="--heads 4 is out of range"):
        compute_text_attention(model, ids, mask, AttentionOptions(methods=("raw",), heads="0,4"))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("kind", ("gpt2", "llama"))
def test_legrad_equals_the_formula_on_decoders(kind):
    """s^l = lm_head(final norm(block l's output at the last real token)), the next-token logit."""
    ids, mask = batch()
    got = compute_text_attention(build_model(kind, "sdpa"), ids, mask, AttentionOptions(methods=("legrad",)))
    model = build_model(kind, "eager")
    blocks = model.transformer.h if kind == "gpt2" else model.model.layers
    norm = model.transformer.ln_f if kind == "gpt2" else model.model.norm
    kept: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _a, out: kept.append(out[0] if isinstance(out, tuple) else out))
             for b in blocks]
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    for h in hooks:
        h.remove()
    last = mask.sum(1) - 1
    idx = torch.tensor(got.targets).view(-1, 1)
    total = 0
    for h, a in zip(kept, out.attentions, strict=True):
        s = model.lm_head(norm(h))[torch.arange(2), last].gather(1, idx).sum()
        g = torch.autograd.grad(s, a, retain_graph=True)[0]
        total = total + g.clamp(min=0).mean(1).sum(1) / mask.sum(1, keepdim=True)
    want = total / len(kept)
    assert want.max() > 0
    for b, n in enumerate(mask.sum(1).tolist()):
        assert torch.allclose(got.values["legrad"][b, :n], want[b, :n], rtol=1e-4, atol=1e-8)
