"""Attention capture and the four attention methods against independent computations.

- captured probabilities == the model's own eager probabilities (torchvision ViT re-run with
  ``need_weights=True``; timm ViT with ``fused_attn=True`` vs the same weights unfused; HF ViT
  with ``attn_implementation="sdpa"`` vs ``"eager"`` with ``output_attentions``);
- captured dS/dA == autograd's gradient at the eager probabilities;
- rollout == Abnar & Zuidema's formula, grad-rollout == Chefer et al.'s, both written here
  from the papers over eager attentions; legrad == torch-cam 0.5's LeGrad oracle (its test's
  ``_manual_legrad``, rewritten here) on torchvision's ViT.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from inspect_model.engine.attention import AttentionCapture, attention_modules, prefix_tokens
from inspect_model.errors import LayerSelectionError, ModelRuntimeError, UsageError
from inspect_model.methods.attention.maps import AttentionOptions
from inspect_model.methods.attention.passes import compute_attention

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def tv_vit(layers: int = 2) -> nn.Module:
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=layers, num_heads=2, hidden_dim=16,
                          mlp_dim=32, num_classes=5).eval().double()
    nn.init.normal_(m.heads.head.weight)  # torchvision starts it at zero: every score would be flat
    return m


def timm_vit(fused: bool = True) -> nn.Module:
    torch.manual_seed(0)
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                          num_classes=5).eval().double()
    for blk in m.blocks:
        blk.attn.fused_attn = fused
    return m


def hf_vit(impl: str) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=32, num_labels=5)
    cfg._attn_implementation = impl
    return transformers.ViTForImageClassification(cfg).eval().double()


def x_batch(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def captured(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    got: dict[str, torch.Tensor] = {}
    with AttentionCapture(model, forward=lambda c: got.__setitem__(c.name, c.probs().clone())):
        out = model(x)
    return getattr(out, "logits", out), got


def test_torchvision_vit_equals_need_weights():
    model, x = tv_vit(), x_batch()
    with torch.no_grad():
        plain = model(x)
        out, got = captured(model, x)
    assert torch.equal(out, plain)  # the model's own output, bit for bit
    ref: dict[str, torch.Tensor] = {}

    busy: list[bool] = []

    def hook(name: str):
        def fn(mod, args, _out):
            if not busy:  # the re-call below runs this hook again
                busy.append(True)
                ref[name] = mod(args[0], args[0], args[0], need_weights=True, average_attn_weights=False)[1]
                busy.clear()
        return fn
    names = attention_modules(model)
    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    assert list(got) == names and len(names) == 2
    for n in names:
        assert got[n].shape == (2, 2, 17, 17)
        torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-12)


def test_timm_fused_equals_unfused():
    fused, eager = timm_vit(True), timm_vit(False)
    x = x_batch()
    ref: dict[str, torch.Tensor] = {}
    for i, blk in enumerate(eager.blocks):
        blk.attn.attn_drop.register_forward_hook(lambda _m, a, _o, i=i: ref.__setitem__(f"blocks.{i}.attn", a[0]))
    with torch.no_grad():
        plain = fused(x)
        out, got = captured(fused, x)
        eager(x)
    assert torch.equal(out, plain)
    assert list(got) == ["blocks.0.attn", "blocks.1.attn"]
    for n in got:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-12)


def test_hf_sdpa_equals_eager_and_math():
    sdpa, eager = hf_vit("sdpa"), hf_vit("eager")
    x = x_batch()
    with torch.no_grad():
        plain = sdpa(x).logits
        out, got = captured(sdpa, x)
        ref = eager(x, output_attentions=True).attentions
    assert torch.equal(out, plain)
    assert len(got) == 2
    for a, b in zip(got.values(), ref, strict=True):
        # HF's eager path takes its softmax in float32 whatever the model's dtype.
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_gradient_at_probabilities_equals_autograd():
    fused, eager = timm_vit(True), timm_vit(False)
    x = x_batch()
    grads: dict[str, torch.Tensor] = {}
    with AttentionCapture(fused, backward=lambda c, g: grads.__setitem__(c.name, g.clone())):
        fused(x)[:, 3].sum().backward()
    probs: list[torch.Tensor] = []

    def keep(_m, _a, out):
        out.retain_grad()
        probs.append(out)
    for blk in eager.blocks:
        blk.attn.attn_drop.register_forward_hook(keep)
    eager(x)[:, 3].sum().backward()
    for i, p in enumerate(probs):
        torch.testing.assert_close(grads[f"blocks.{i}.attn"], p.grad, rtol=1e-9, atol=1e-12)


def test_causal_and_masked_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)

    class Attn(nn.Module):
        def forward(self, q, k, v, **kw):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attn()

        def forward(self, **kw):
            return self.attn(q, k, v, **kw)
    model = Model()
    for kw in ({"is_causal": True}, {"attn_mask": mask}, {"attn_mask": torch.randn(5, 5, dtype=torch.float64)},
               {"scale": 0.3}):
        got: list[torch.Tensor] = []
        with AttentionCapture(model, forward=lambda c, got=got: got.append(c.probs())):
            out = model(**kw)
        logits = q @ k.transpose(-2, -1) * kw.get("scale", 0.5)
        if kw.get("is_causal"):
            logits = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        m = kw.get("attn_mask")
        if m is not None:
            logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m
        ref = logits.softmax(-1)
        torch.testing.assert_close(got[0], ref)
        torch.testing.assert_close(out, ref @ v)  # and the op's own output is what that means


# -- the methods against the papers' formulas --------------------------------------------------

def eager_attention(model: nn.Module, x: torch.Tensor, target: int | None = None):
    """HF eager attentions (and their gradients for ``target``), independent of the capture."""
    out = model(x, output_attentions=True)
    atts = out.attentions
    if target is None:
        return [a.detach() for a in atts], None
    for a in atts:
        a.retain_grad()
    out.logits[:, target].sum().backward()
    return [a.detach() for a in atts], [a.grad for a in atts]


def test_rollout_equals_abnar_zuidema():
    model, x = hf_vit("sdpa"), x_batch()
    atts, _ = eager_attention(hf_vit("eager"), x)
    res = compute_attention(model, x, AttentionOptions(methods=("rollout",)))
    for b in range(2):
        r = torch.eye(17, dtype=torch.float64)
        for a in atts:  # A_hat = 0.5 mean_h(A) + 0.5 I, rows sum to one; R = A_hat_l ... A_hat_1
            ahat = 0.5 * a[b].mean(0) + 0.5 * torch.eye(17, dtype=torch.float64)
            ahat = ahat / ahat.sum(-1, keepdim=True)
            r = ahat @ r
        torch.testing.assert_close(res.maps["rollout"][b].double(), r[0, 1:].reshape(4, 4), rtol=1e-5, atol=1e-7)


def test_rollout_head_fusion_max():
    model, x = hf_vit("sdpa"), x_batch(1)
    atts, _ = eager_attention(hf_vit("eager"), x)
    res = compute_attention(model, x, AttentionOptions(methods=("rollout",), head_fusion="max"))
    r = torch.eye(17, dtype=torch.float64)
    for a in atts:
        ahat = 0.5 * a[0].max(0).values + 0.5 * torch.eye(17, dtype=torch.float64)
        r = (ahat / ahat.sum(-1, keepdim=True)) @ r
    torch.testing.assert_close(res.maps["rollout"][0].double(), r[0, 1:].reshape(4, 4), rtol=1e-5, atol=1e-7)


def test_grad_rollout_equals_chefer():
    model, x = hf_vit("sdpa"), x_batch()
    atts, grads = eager_attention(hf_vit("eager"), x, target=2)
    res = compute_attention(model, x, AttentionOptions(methods=("grad-rollout",)), target=2)
    assert res.targets == [2, 2]
    for b in range(2):
        r = torch.eye(17, dtype=torch.float64)
        for a, g in zip(atts, grads, strict=True):  # eq. 5-6: A_bar = E_h[(grad * A)^+]; R += A_bar R
            abar = (g[b] * a[b]).clamp(min=0).mean(0)
            r = r + abar @ r
        torch.testing.assert_close(res.maps["grad-rollout"][b].double(), r[0, 1:].reshape(4, 4),
                                   rtol=1e-5, atol=1e-7)


def torchcam_legrad(model: nn.Module, x: torch.Tensor, class_idx: int, layers: list[int]) -> torch.Tensor:
    """torch-cam 0.5's LeGrad on torchvision's ViT, after its own test oracle (`_manual_legrad`)."""
    import torch.nn.functional as F

    tokens = model._process_input(x)
    tokens = torch.cat([model.class_token.expand(x.shape[0], -1, -1), tokens], dim=1)
    tokens = tokens + model.encoder.pos_embedding
    attentions, scores = [], []
    for block in model.encoder.layers:
        h = block.ln_1(tokens)
        att = block.self_attention
        q, k, v = F.linear(h, att.in_proj_weight, att.in_proj_bias).chunk(3, dim=-1)
        b, n, e = q.shape
        d = e // att.num_heads
        q, k, v = (t.reshape(b, n, att.num_heads, d).transpose(1, 2) for t in (q, k, v))
        p = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1)
        o = att.out_proj((p @ v).transpose(1, 2).reshape(b, n, e))
        y = tokens + o
        tokens = y + block.mlp(block.ln_2(y))
        attentions.append(p)
        scores.append(model.heads(model.encoder.ln(tokens.mean(dim=1))))
    maps = []
    for i in layers:
        grad = torch.autograd.grad(scores[i][:, class_idx].sum(), attentions[i], retain_graph=True)[0]
        maps.append(grad.relu().mean(dim=(1, 2))[:, 1:].reshape(b, 4, 4))
    cam = torch.stack(maps).mean(0)
    cam = cam - cam.flatten(1).min(-1).values[:, None, None]
    return cam / (cam.flatten(1).max(-1).values[:, None, None] + 1e-8)


@pytest.mark.parametrize("layers", [[0, 1, 2], [1, 2]])
def test_legrad_equals_torchcam(layers):
    model, x = tv_vit(3), x_batch()
    ref = torchcam_legrad(model, x, 4, layers)
    res = compute_attention(model, x, AttentionOptions(methods=("legrad",), layers=tuple(map(str, layers))),
                            target=4)
    got = res.maps["legrad"].double()
    got = got - got.flatten(1).min(-1).values[:, None, None]
    got = got / (got.flatten(1).max(-1).values[:, None, None] + 1e-8)
    for b in range(2):
        r = torch.corrcoef(torch.stack([got[b].flatten(), ref[b].flatten()]))[0, 1]
        assert r >= 0.99
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_raw_heads_and_query():
    model, x = hf_vit("sdpa"), x_batch()
    atts, _ = eager_attention(hf_vit("eager"), x)
    res = compute_attention(model, x, AttentionOptions(methods=("raw",), layers=("0", "-1"), heads="1,0",
                                                       query="3"))
    assert list(res.raw) == ["vit.layers.0.attention", "vit.layers.1.attention"]
    assert res.head_labels["vit.layers.0.attention"] == ["head 1", "head 0"]
    torch.testing.assert_close(res.raw["vit.layers.0.attention"].double(),
                               atts[0][:, [1, 0], 3, 1:].reshape(2, 2, 4, 4), rtol=1e-6, atol=1e-8)
    res = compute_attention(model, x, AttentionOptions(methods=("raw",), heads="max", query="mean"))
    torch.testing.assert_close(res.raw["vit.layers.1.attention"][:, 0].double(),
                               atts[1].mean(2).max(1).values[:, 1:].reshape(2, 4, 4), rtol=1e-6, atol=1e-8)


# -- refusals and a model given back -----------------------------------------------------------

def test_no_attention_found():
    from fixtures.models import TinyCNN

    with pytest.raises(LayerSelectionError, match="no attention found in TinyCNN"):
        compute_attention(TinyCNN().eval(), torch.randn(1, 3, 16, 16))


def test_heads_out_of_range():
    with pytest.raises(UsageError, match=r"--heads 5 is out of range: .* has 2 heads \(0..1\)"):
        compute_attention(hf_vit("sdpa"), x_batch(), AttentionOptions(methods=("raw",), heads="0,5"))
    with pytest.raises(LayerSelectionError, match="--layers 7 is out of range"):
        compute_attention(hf_vit("sdpa"), x_batch(), AttentionOptions(methods=("raw",), layers=("7",)))


def tv_swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=[3, 3],
                           num_classes=3).eval().double()


def timm_swin() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=40, patch_size=4,
                             window_size=3, depths=(2, 2), num_heads=(2, 2), embed_dim=8, num_classes=3).eval().double()


def received_by_token_ids(model: nn.Module, x: torch.Tensor, torchvision: bool) -> dict[str, torch.Tensor]:
    """Independent of the tool's inverse: the window code run forwards on a map of token ids,
    and each window token's received attention (mean over queries) scattered to its id."""
    import torch.nn.functional as F

    geo: dict[str, tuple] = {}
    probs: dict[str, torch.Tensor] = {}
    owners = {n: m for n, m in model.named_modules() if hasattr(m, "window_size") and hasattr(m, "shift_size")}
    for n, m in owners.items():
        m.register_forward_pre_hook(lambda _m, a, n=n: geo.__setitem__(n, tuple(a[0].shape[1:3])))
    with AttentionCapture(model, forward=lambda c: probs.__setitem__(c.name, c.probs().clone())):
        model(x)
    out = {}
    for name, p in probs.items():
        owner = name if name in owners else name.rsplit(".", 1)[0]
        m, (h, w) = owners[owner], geo[owner]
        ws, sh = [int(v) for v in np.atleast_1d(m.window_size)], [int(v) for v in np.atleast_1d(m.shift_size)]
        ws, sh = (ws * 2)[:2], (sh * 2)[:2]
        ids = torch.arange(h * w, dtype=torch.float64).reshape(1, h, w, 1) + 1  # 0 marks padding
        if torchvision:
            ids = F.pad(ids, (0, 0, 0, (ws[1] - w % ws[1]) % ws[1], 0, (ws[0] - h % ws[0]) % ws[0]))
            sh = [0 if ws[i] >= ids.shape[1 + i] else sh[i] for i in range(2)]
            ids = torch.roll(ids, (-sh[0], -sh[1]), (1, 2))
        else:
            ids = torch.roll(ids, (-sh[0], -sh[1]), (1, 2))
            ids = F.pad(ids, (0, 0, 0, (ws[1] - w % ws[1]) % ws[1], 0, (ws[0] - h % ws[0]) % ws[0]))
        ph, pw = ids.shape[1:3]
        win = ids.view(1, ph // ws[0], ws[0], pw // ws[1], ws[1]).permute(0, 1, 3, 2, 4).reshape(-1)
        rec = p.mean(dim=2)  # (windows, heads, N)
        flat = torch.zeros(rec.shape[1], h * w + 1, dtype=torch.float64)
        flat[:, win.long()] = rec.permute(1, 0, 2).reshape(rec.shape[1], -1)
        out[name] = flat[:, 1:].reshape(-1, h, w)
    return out


@pytest.mark.parametrize("family", ["torchvision", "timm"])
def test_swin_windows_mapped_back(family):
    model = tv_swin() if family == "torchvision" else timm_swin()
    x = torch.randn(1, 3, 40, 40, dtype=torch.float64)
    ref = received_by_token_ids(model, x, family == "torchvision")
    res = compute_attention(model, x, AttentionOptions(methods=("raw",), layers=("all",), heads="all"))
    assert list(res.raw) == list(ref) and len(ref) == 4
    shifted = 0
    for name, r in ref.items():
        torch.testing.assert_close(res.raw[name][0].double(), r, rtol=1e-6, atol=1e-8)
        shifted += int(any(v for v in np.atleast_1d(model.get_submodule(
            name if hasattr(model.get_submodule(name), "shift_size") else name.rsplit(".", 1)[0]).shift_size)))
    assert shifted >= 1  # a shifted window was mapped back too


def test_model_given_back():
    model = timm_vit(True).train()
    model.blocks[0].attn.qkv.weight.requires_grad_(False)
    flags = [(m.training) for m in model.modules()]
    req = [p.requires_grad for p in model.parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    compute_attention(model, x_batch(), AttentionOptions(methods=("all",)))
    assert [m.training for m in model.modules()] == flags
    assert [p.requires_grad for p in model.parameters()] == req
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert prefix_tokens(model) == 1


def test_native_fast_path_recompute_equals_need_weights():
    """Off the CPU the fast path's probabilities are recomputed from its inputs: same numbers."""
    from inspect_model.engine.attention_ops import native_probs as _native_probs

    torch.manual_seed(0)
    m = nn.MultiheadAttention(16, 4, batch_first=True).eval().double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    bound = {"query": x, "key": x, "qkv_weight": m.in_proj_weight, "qkv_bias": m.in_proj_bias, "embed_dim": 16,
             "mask": pad, "mask_type": 1}
    ref = m(x, x, x, key_padding_mask=pad, need_weights=True, average_attn_weights=False)[1]
    torch.testing.assert_close(_native_probs(bound, 4), ref)


def test_maxvit_block_and_grid_attention_mapped_back():
    """MaxViT's own partition code run on a map of token ids gives where each token came from."""
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    model = MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[8, 16],
                   block_layers=[1, 1], head_dim=4, stochastic_depth_prob=0.0, num_classes=3).eval().double()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    probs: dict[str, torch.Tensor] = {}
    with AttentionCapture(model, forward=lambda c: probs.__setitem__(c.name, c.probs().clone())):
        model(x)
    res = compute_attention(model, x, AttentionOptions(methods=("raw",), layers=("all",), heads="all"))
    assert len(probs) == 4 and {n.split(".")[-3] for n in probs} == {"window_attention", "grid_attention"}
    for name, p in probs.items():
        layer = model.get_submodule(name.rsplit(".", 2)[0])
        h, w = layer.grid_size
        ids = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
        ids = layer.partition_swap(layer.partition_op(ids, layer.p)).reshape(-1)  # (groups * tokens,)
        rec = p.mean(dim=2)  # (groups, heads, N)
        flat = torch.zeros(rec.shape[1], h * w, dtype=torch.float64)
        flat[:, ids.long()] = rec.permute(1, 0, 2).reshape(rec.shape[1], -1)
        torch.testing.assert_close(res.raw[name][0].double(), flat.reshape(-1, h, w), rtol=1e-6, atol=1e-8)


def test_failing_forward_gives_the_model_back():
    """A model that raises after its attention (and inside an nn.MultiheadAttention): every hook,
    torch-function mode and dispatch mode is gone, flags restored, the error is one line."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 3)
            self.head.register_forward_hook(lambda *_: 1 / 0)

        def forward(self, x):
            t = x.flatten(2).transpose(1, 2)[..., :8]
            t = self.attn(t, t, t, need_weights=False)[0]
            bad = torch.zeros(3, 3, dtype=torch.bool)  # a key padding mask of the wrong shape
            t = t + self.attn(t, t, t, key_padding_mask=bad)[0] if x.shape[0] > 1 else t
            return self.head(t.mean(1))

    model = Boom().train()
    opts = AttentionOptions(methods=("raw", "rollout", "grad-rollout"))
    for n, where in ((1, "head': ZeroDivisionError"), (2, "attn': ")):
        with pytest.raises(ModelRuntimeError, match=f"forward pass failed in layer '{where}"):
            compute_attention(model, torch.randn(n, 8, 4, 4), opts)
    assert model.training and all(m.training for m in model.modules())
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    handles = [m for m in model.modules() if m._forward_pre_hooks or (m._forward_hooks and m is not model.head)]
    assert not handles and len(model.head._forward_hooks) == 1  # the model's own hook stays
    assert not _get_current_function_mode_stack() and not _get_current_dispatch_mode_stack()
    assert torch._C._is_torch_function_enabled()
