"""Activation patching's numbers (issue 36), against computations written here: the clean
and corrupted ends of the scale, one cell against a hand-written forward hook, one head
against a hand-written pre-hook on the output projection, causal tracing's noise and
window, on tiny GPT-2, Llama (GQA, RoPE), Qwen2 and T5 (decoder) models built offline."""

from __future__ import annotations

import pytest
import torch

from inspect_model.methods.lm.anatomy import find_anatomy
from inspect_model.methods.lm.grid import Noise, PairRun, run_pair
from inspect_model.methods.lm.metrics import MetricSpec, Metric, compute, parse_metric
from inspect_model.methods.lm.patching import Patch, grid_cells, modules_of


def build(kind: str, impl: str = "sdpa"):
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      attn_implementation=impl)
        return transformers.GPT2LMHeadModel(cfg).eval()
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                       attn_implementation=impl)
        return transformers.LlamaForCausalLM(cfg).eval()
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                       attn_implementation=impl)
        return transformers.Qwen2ForCausalLM(cfg).eval()
    from fixtures.task_models import build as build_task

    return build_task("t5")


def caller(model):
    if getattr(model.config, "is_encoder_decoder", False):
        enc = torch.tensor([[5, 6, 1]])
        return lambda ids: model(input_ids=enc.expand(ids.shape[0], -1), decoder_input_ids=ids, use_cache=False).logits
    return lambda ids: model(input_ids=ids, use_cache=False).logits


CLEAN = torch.tensor([3, 9, 14, 22, 7, 30])
CORRUPT = torch.tensor([3, 9, 41, 22, 7, 30])
METRIC = Metric(MetricSpec("logit-diff", ("a", "b")), (11, 12), ("a", "b"))
KINDS = ["gpt2", "llama", "qwen2", "t5"]


def _run(model, **kw):
    mods = modules_of(model, find_anatomy(model))
    sites = kw.pop("sites", ("resid", "attn", "mlp", "head"))
    return PairRun(model, mods, caller(model), kw.pop("metric", METRIC), clean=CLEAN, corrupt=CORRUPT, sites=sites,
                   **kw), mods


@pytest.mark.parametrize("kind", KINDS)
def test_ends_of_the_scale(kind: str) -> None:
    model = build(kind)
    run, mods = _run(model)
    with run:
        full = run.values([tuple(Patch("resid", 0, p) for p in range(len(CLEAN)))], 8)[0]
        nothing = run.values([()], 8)[0]
        clean, corrupt = run.m_clean, run.m_corrupt
    assert abs(corrupt - clean) > 1e-4
    assert abs((full - corrupt) / (clean - corrupt) - 1.0) < 1e-6
    assert abs((nothing - corrupt) / (clean - corrupt)) < 1e-6
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _hand(model, module, write, ids):
    h = module.register_forward_hook(write)
    try:
        with torch.no_grad():
            return caller(model)(ids[None])[0, -1]
    finally:
        h.remove()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("site", ["resid", "attn", "mlp"])
def test_one_cell_equals_a_hand_written_hook(kind: str, site: str) -> None:
    model = build(kind)
    mods = modules_of(model, find_anatomy(model))
    layer, pos = 1, 2
    module = mods.module(site, layer)
    seen = {}

    def keep(_m, _a, out):
        seen["h"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    _hand(model, module, keep, CLEAN)

    def write(_m, _a, out):
        h = (out[0] if isinstance(out, tuple) else out).clone()
        h[0, pos] = seen["h"][0, pos]
        return (h, *out[1:]) if isinstance(out, tuple) else h

    logits = _hand(model, module, write, CORRUPT)
    expected = float(logits[11] - logits[12])
    run, _ = _run(model)
    with run:
        got = run.values([(Patch(site, layer, pos),), (Patch("resid", 0, 0),)], 8)[0]
    assert abs(got - expected) < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_one_head_equals_a_hand_written_pre_hook(kind: str) -> None:
    model = build(kind)
    mods = modules_of(model, find_anatomy(model))
    layer, head, dh = 1, 2, mods.head_dim
    proj = mods.module("head", layer)
    seen = {}
    h = proj.register_forward_pre_hook(lambda _m, a: seen.__setitem__("z", a[0].detach().clone()))
    with torch.no_grad():
        caller(model)(CLEAN[None])
    h.remove()

    def write(_m, a):
        z = a[0].clone()
        z[..., head * dh:(head + 1) * dh] = seen["z"][..., head * dh:(head + 1) * dh]
        return (z,)

    h = proj.register_forward_pre_hook(write)
    with torch.no_grad():
        logits = caller(model)(CORRUPT[None])[0, -1]
    h.remove()
    run, _ = _run(model, sites=("head",))
    with run:
        got = run.values([(Patch("head", layer, head),), (Patch("head", 0, 1),)], 8)[0]
    assert abs(got - float(logits[11] - logits[12])) < 1e-5


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_heads_are_the_same_under_eager_and_sdpa(impl: str) -> None:
    model = build("llama", impl)
    mods = modules_of(model, find_anatomy(model))
    out = run_pair(model, mods, caller(model), METRIC, clean=CLEAN, corrupt=CORRUPT, sites=("head",), per_forward=3)
    ref = run_pair(build("llama", "eager"), mods, caller(model), METRIC, clean=CLEAN, corrupt=CORRUPT,
                   sites=("head",), per_forward=8) if impl == "sdpa" else out
    assert torch.allclose(torch.tensor(out.grids[0].raw), torch.tensor(ref.grids[0].raw), atol=1e-5)


def test_batched_grid_equals_one_cell_per_forward() -> None:
    model = build("gpt2")
    mods = modules_of(model, find_anatomy(model))
    a = run_pair(model, mods, caller(model), METRIC, clean=CLEAN, corrupt=CORRUPT, sites=("resid", "head"),
                 per_forward=1)
    b = run_pair(model, mods, caller(model), METRIC, clean=CLEAN, corrupt=CORRUPT, sites=("resid", "head"),
                 per_forward=7)
    assert a.forwards == 2 * 6 + 2 * 4 and b.forwards == 2 + 2  # 12 cells / 7 per forward, 8 heads / 7
    for ga, gb in zip(a.grids, b.grids):
        assert torch.allclose(torch.tensor(ga.raw), torch.tensor(gb.raw), atol=1e-5)


def test_noise_direction_keeps_the_convention() -> None:
    model = build("gpt2")
    mods = modules_of(model, find_anatomy(model))
    out = run_pair(model, mods, caller(model), METRIC, clean=CLEAN, corrupt=CORRUPT, sites=("resid",),
                   per_forward=16, denoise=False)
    # --noise: the clean prompt runs; writing the corrupted layer-0 residual at the changed
    # token's position and after gives the corrupted run's value (normalised 0) at the last layer
    last = out.grids[0].normalised[-1]
    assert abs(last[-1] - 0.0) < 1e-5  # (batched vs one-row forward) the last position's final residual is all the logits see
    assert abs(last[0] - 1.0) < 1e-5  # position 0 is the same token in both prompts


def test_kl_is_zero_for_the_clean_run_and_normalised_one() -> None:
    model = build("gpt2")
    mods = modules_of(model, find_anatomy(model))
    kl = Metric(MetricSpec("kl"), (), ())
    run = PairRun(model, mods, caller(model), kl, clean=CLEAN, corrupt=CORRUPT, sites=("resid",))
    with run:
        assert run.m_clean == 0.0 and run.m_corrupt > 0
        full = run.values([tuple(Patch("resid", 0, p) for p in range(6))], 4)[0]
    assert abs(full) < 1e-6
    p = torch.softmax(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), -1)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    got = compute(kl, q.log(), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert abs(float(got[0]) - float((p * (p.log() - q[0].log())).sum())) < 1e-9


def test_causal_tracing_noise_and_restore() -> None:
    model = build("gpt2")
    mods = modules_of(model, find_anatomy(model))
    prob = Metric(MetricSpec("prob"), (), ())
    noise = Noise(first=1, end=3, std=0.5, samples=4, seed=3)
    run = PairRun(model, mods, caller(model), prob, clean=CLEAN, corrupt=None, sites=("resid", "mlp"), noise=noise)
    with run:
        top = int(run.clean_logits.argmax())
        assert run.metric.ids == (top,)
        restored = run.values([tuple(Patch("resid", 0, p) for p in range(6))], 8)[0]
        none = run.values([()], 8)[0]
    assert abs(restored - run.m_clean) < 1e-6
    assert abs(none - run.m_corrupt) < 1e-6
    # the corrupted value by hand: the same draws added to the embeddings of tokens 1..2
    draws = noise.draws(32, "cpu")
    with torch.no_grad():
        emb = model.transformer.wte(CLEAN)[None].repeat(4, 1, 1)
        emb[:, 1:3] += draws
        logits = model(inputs_embeds=emb).logits[:, -1]
    assert abs(float(torch.softmax(logits, -1)[:, top].mean()) - run.m_corrupt) < 1e-6


def test_window_cells_follow_rome() -> None:
    cells = grid_cells("mlp", 6, 1, window=3)
    assert [tuple(p.layer for p in c) for c in cells] == [(0, 1), (0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5)]
    assert [len(c) for c in grid_cells("resid", 6, 1, window=3)] == [1] * 6  # ROME windows attn/mlp only


def test_metric_specs() -> None:
    assert parse_metric("logit-diff: A, B") == MetricSpec("logit-diff", (" A", " B"))
    assert parse_metric("prob") == MetricSpec("prob", ())
    assert parse_metric("logprob: mat") == MetricSpec("logprob", (" mat",))
    from inspect_model.errors import UsageError

    for bad in ("logit-diff: A", "kl:x", "acc", "prob:"):
        with pytest.raises(UsageError):
            parse_metric(bad)
