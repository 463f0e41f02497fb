"""The logit lens and the tuned lens (methods/lm/lens.py, tuned.py) against computations
written here from the model's own modules (issue 36): at the last block the lens logits are
the model's (max |diff| <= 1e-5), at a middle block they are ``lm_head(final_norm(h_l))``
with ``h_l = hidden_states[l]`` from transformers; a tuned lens of zeros is the logit lens
exactly, a random one is ``lm_head(norm(h + W h + b))``."""

from __future__ import annotations

import pytest
import torch

from fixtures.lm_models import build_lm
from inspect_model.methods.lm.anatomy import find_anatomy, readout
from inspect_model.methods.lm.lens import LensCapture, decode, sites_of
from inspect_model.methods.lm.tuned import TunedLens

IDS = torch.tensor([[3, 5, 7, 9, 11, 4], [8, 6, 10, 12, 14, 16]])
# The final norm and unembedding of each family, written out (not found): the independent side.
HEADS = {"gpt2": lambda m: (m.transformer.ln_f, m.lm_head), "llama": lambda m: (m.model.norm, m.lm_head),
         "qwen2": lambda m: (m.model.norm, m.lm_head)}


def _lens(model, kinds=("resid",), tuned=None):
    a = find_anatomy(model)
    with LensCapture(model, a, sites_of(a, kinds)) as cap:
        states, logits, _ = cap.run(IDS)
    return a, states, logits, decode(model, a, states, logits, top_k=4, tuned=tuned)


def _reference(model, kind):
    with torch.no_grad():
        out = model(input_ids=IDS, output_hidden_states=True)
    return out.logits, out.hidden_states, HEADS[kind](model)


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_last_block_is_the_model_and_middle_block_is_the_formula(kind):
    model = build_lm(kind)
    a, states, logits, (decoded, predicted, check) = _lens(model)
    ref_logits, hs, (norm, head) = _reference(model, kind)
    by_depth = {s.depth: (s, h) for s, h in states.items()}
    last_site, last_h = by_depth[len(a.blocks)]
    with torch.no_grad():
        assert (readout(model, a, last_h) - ref_logits).abs().max().item() <= 1e-5
        assert check <= 1e-5
        assert torch.equal(predicted, ref_logits.argmax(-1))
        for depth in (1, 2):  # hidden_states[l] is block l-1's output: a middle layer, by hand
            site, h = by_depth[depth]
            assert torch.allclose(h, hs[depth], atol=1e-6)
            want = head(norm(hs[depth]))
            assert (readout(model, a, h) - want).abs().max().item() <= 1e-5
            logp, final = want.log_softmax(-1), ref_logits.log_softmax(-1)
            row = next(d for d in decoded if d.site == site)
            pred = ref_logits.argmax(-1, keepdim=True)
            assert torch.allclose(row.prob, logp.exp().gather(-1, pred)[..., 0], atol=1e-6)
            assert torch.allclose(row.kl, (final.exp() * (final - logp)).sum(-1), atol=1e-6)
            assert torch.allclose(row.entropy, -(logp.exp() * logp).sum(-1), atol=1e-5)
            assert torch.equal(row.top_ids, logp.topk(4, dim=-1).indices)
            assert torch.equal(row.rank, (want > want.gather(-1, pred)).sum(-1) + 1)
    assert torch.equal(by_depth[0][1], hs[0])  # depth 0: the embeddings (block 0's input)
    final_row = next(d for d in decoded if d.site.depth == len(a.blocks))
    assert final_row.kl.abs().max().item() <= 1e-6 and (final_row.rank == 1).all()


def _tuned(d: int, n: int, scale: float, seed: int = 1) -> TunedLens:
    g = torch.Generator().manual_seed(seed)
    ws = tuple(scale * torch.randn(d, d, generator=g) for _ in range(n))
    bs = tuple(scale * torch.randn(d, generator=g) for _ in range(n))
    return TunedLens("test", ws, bs, {})


def test_identity_tuned_lens_is_the_logit_lens_exactly():
    model = build_lm("llama")
    *_, (plain, _, _) = _lens(model)
    *_, (tuned, _, _) = _lens(model, tuned=_tuned(32, 3, 0.0))
    for p, t in zip(plain, tuned):
        for f in ("prob", "rank", "entropy", "kl", "top_ids", "top_probs"):
            assert torch.equal(getattr(p, f), getattr(t, f)), f


def test_random_tuned_lens_is_the_formula():
    model = build_lm("gpt2")
    lens = _tuned(32, 3, 0.2)
    *_, (decoded, _, _) = _lens(model, tuned=lens)
    ref_logits, hs, (norm, head) = _reference(model, "gpt2")
    final = ref_logits.log_softmax(-1)
    with torch.no_grad():
        for row in decoded:
            i = row.site.depth
            h = hs[i] if i < 3 else None
            if h is None:  # the last block: no translator (tuned-lens decodes the model's own output)
                assert row.kl.abs().max().item() <= 1e-6
                continue
            moved = h + h @ lens.weights[i].T + lens.biases[i]  # tuned-lens transform_hidden: h + W h + b
            logp = head(norm(moved)).log_softmax(-1)
            assert torch.allclose(row.kl, (final.exp() * (final - logp)).sum(-1), atol=1e-5)
            assert torch.equal(row.top_ids, logp.topk(4, dim=-1).indices)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["t5", "bart", "mistral", "gptneox", "opt", "phi", "gemma", "gemma2"])
def test_other_families_read_out_the_model(kind):
    model = build_lm(kind)
    a = find_anatomy(model)
    kw = {"decoder_input_ids": IDS} if a.encoder_decoder else {}
    bind = model.register_forward_pre_hook(lambda _m, args, k: ((), {"input_ids": args[0], **kw}) if args else None,
                                           with_kwargs=True, prepend=True)
    try:
        with LensCapture(model, a, sites_of(a, ("resid", "attn", "mlp"))) as cap:
            states, logits, _ = cap.run(IDS)
    finally:
        bind.remove()
    decoded, _, check = decode(model, a, states, logits, top_k=2)
    assert check <= 1e-5 and len(decoded) == 3 * 3 + 1
    with torch.no_grad():
        hs = model(input_ids=IDS, output_hidden_states=True, **kw)
    hs = hs.decoder_hidden_states if a.encoder_decoder else hs.hidden_states
    mid = next(h for s, h in states.items() if s.site == "resid" and s.depth == 1)
    assert torch.allclose(mid, hs[1], atol=1e-6)


class _MaskedHead(torch.nn.Linear):
    """An unembedding that forbids its last 3 tokens (-inf logits): 0 log 0 terms must count 0."""

    def forward(self, x):
        out = super().forward(x)
        out[..., -3:] = float("-inf")
        return out


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))  # a residual block: its output is the stream


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(2))
        self.norm = torch.nn.LayerNorm(8)
        self.head = _MaskedHead(8, 16)

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def test_masked_vocabulary_gives_finite_entropy_and_kl():
    torch.manual_seed(0)
    model = _Tiny().eval()
    a = find_anatomy(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    with LensCapture(model, a, sites_of(a, ("resid",))) as cap:
        states, logits, _ = cap.run(ids)
    decoded, _, check = decode(model, a, states, logits, top_k=3)
    assert check == 0.0
    final = logits.log_softmax(-1)
    for row in decoded:
        h = next(v for s, v in states.items() if s == row.site)
        with torch.no_grad():
            logp = readout(model, a, h).log_softmax(-1)
        p = logp.exp()
        want_h = -(p[..., :-3] * logp[..., :-3]).sum(-1)
        want_kl = (final.exp()[..., :-3] * (final[..., :-3] - logp[..., :-3])).sum(-1)
        assert torch.isfinite(row.entropy).all() and torch.allclose(row.entropy, want_h, atol=1e-5)
        assert torch.allclose(row.kl, want_kl.clamp(min=0), atol=1e-5)
