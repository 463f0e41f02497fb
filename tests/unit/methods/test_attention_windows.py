"""Rollout and grad-rollout through windowed, hierarchical transformers, against a dense
computation written here.

For each attention call of a tiny Swin (torchvision, timm) or MaxViT, the full (tokens x
tokens) matrix of the layer is materialised from the captured windows: the model's window
geometry is run forwards on a map of token ids (padding, cyclic shift and partition written
out here for Swin; MaxViT's own ``partition_op``/``partition_swap``), each window's block
scattered into a dense matrix over the padded map, and the padding rows and columns cut.
Stages are joined by an explicit 2x2 mean-pooling matrix. Then R = M_L ... D ... M_1 as
dense products, and the map is R's mean row (the head averages the last stage's tokens).
The probabilities and their gradients come from a torch-function mode of the test's own
that keeps every attention softmax (not the tool's capture).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from inspect_model.errors import UsageError
from inspect_model.methods.attention.maps import AttentionOptions
from inspect_model.methods.attention.passes import compute_attention

timm = pytest.importorskip("timm")


def sharpened(model: nn.Module) -> nn.Module:
    """Weights larger than the init's (std 0.02), so that attention is far from uniform and
    the maps have structure to compare."""
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if p.dim() >= 2 or "bias_table" in name:
            nn.init.normal_(p, std=0.4)
    return model


def tv_swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return sharpened(SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[2, 2],
                                     window_size=[3, 3], num_classes=3).eval().double())


def tv_swin_v2() -> nn.Module:
    from torchvision.models.swin_transformer import (
        PatchMergingV2,
        SwinTransformer,
        SwinTransformerBlockV2,
    )

    torch.manual_seed(0)
    return sharpened(SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[2, 2],
                                     window_size=[4, 4], num_classes=3, block=SwinTransformerBlockV2,
                                     downsample_layer=PatchMergingV2).eval().double())


def timm_swin() -> nn.Module:
    torch.manual_seed(0)
    return sharpened(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=40, patch_size=4,
                                       window_size=3, depths=(2, 2), num_heads=(2, 2), embed_dim=8,
                                       num_classes=3).eval().double())


def maxvit() -> nn.Module:
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    return sharpened(MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[8, 16],
                            block_layers=[1, 1], head_dim=4, stochastic_depth_prob=0.0, num_classes=3).eval().double())


class Softmaxes(TorchFunctionMode):
    """Keeps every 4-d softmax over the last dim (the attention probabilities), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.probs: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        dim = (kwargs or {}).get("dim", args[1] if len(args) > 1 else None)
        if func in (F.softmax, torch.softmax, torch.Tensor.softmax) and out.dim() >= 4 and dim in (-1, out.dim() - 1):
            self.probs.append(out)  # Swin (B * G, h, N, N), MaxViT (B, G, h, N, N)
        return out


def swin_geometry(model: nn.Module, torchvision: bool) -> list[tuple[int, int, torch.Tensor]]:
    """Per attention call: (H, W, ids) with ids (windows, N) the padded-map index of each
    window token (padded map of Ph x Pw, row-major); pad, shift, partition as the model does."""
    owners = [m for m in model.modules() if hasattr(m, "window_size") and hasattr(m, "shift_size")]
    seen: list[tuple[nn.Module, tuple[int, int]]] = []
    handles = [m.register_forward_pre_hook(lambda m, a: seen.append((m, tuple(a[0].shape[1:3])))) for m in owners]
    with torch.no_grad():
        model(torch.zeros(1, 3, 40, 40, dtype=torch.float64))
    for h in handles:
        h.remove()
    out = []
    for m, (h, w) in seen:
        ws = (list(np.atleast_1d(m.window_size)) * 2)[:2]
        sh = (list(np.atleast_1d(m.shift_size)) * 2)[:2]
        ph, pw = h + (-h) % ws[0], w + (-w) % ws[1]
        ids = torch.arange(ph * pw).reshape(ph, pw)  # the padded map: real tokens at [:h, :w]
        if torchvision:
            sh = [0 if ws[i] >= (ph, pw)[i] else sh[i] for i in range(2)]
            ids = torch.roll(ids, (-sh[0], -sh[1]), (0, 1))
        else:  # timm shifts the (H, W) map, then pads
            real = torch.roll(torch.arange(ph * pw).reshape(ph, pw)[:h, :w], (-sh[0], -sh[1]), (0, 1))
            ids = torch.arange(ph * pw).reshape(ph, pw)
            ids[:h, :w] = real
        win = ids.reshape(ph // ws[0], ws[0], pw // ws[1], ws[1]).permute(0, 2, 1, 3).reshape(-1, ws[0] * ws[1])
        out.append((h, w, win, (ph, pw)))
    return out


def maxvit_geometry(model: nn.Module) -> list[tuple[int, int, torch.Tensor, tuple[int, int]]]:
    out = []
    for layer in model.modules():
        if hasattr(layer, "partition_swap") and hasattr(layer, "grid_size"):
            h, w = layer.grid_size
            ids = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
            win = layer.partition_swap(layer.partition_op(ids, layer.p))  # (1, groups, N, 1)
            out.append((h, w, win.reshape(win.shape[1], win.shape[2]).long(), (h, w)))
    return out


def dense(blocks: torch.Tensor, geo: tuple) -> torch.Tensor:
    """(windows, N, N) blocks -> the layer's (H*W, H*W) matrix over the real tokens."""
    h, w, win, (ph, pw) = geo
    m = torch.zeros(ph * pw, ph * pw, dtype=torch.float64)
    for g in range(win.shape[0]):
        m[win[g][:, None], win[g][None, :]] = blocks[g]
    real = torch.arange(ph * pw).reshape(ph, pw)[:h, :w].reshape(-1)
    return m[real][:, real]


def pooling(fine: tuple[int, int], coarse: tuple[int, int]) -> torch.Tensor:
    """(h*w, H*W): each coarse token the mean of the 2x2 fine tokens under it."""
    d = torch.zeros(coarse[0] * coarse[1], fine[0] * fine[1], dtype=torch.float64)
    for i in range(coarse[0]):
        for j in range(coarse[1]):
            kids = [(2 * i + a) * fine[1] + 2 * j + b for a in (0, 1) for b in (0, 1)
                    if 2 * i + a < fine[0] and 2 * j + b < fine[1]]
            d[i * coarse[1] + j, kids] = 1.0 / len(kids)
    return d


def dense_maps(model: nn.Module, x: torch.Tensor, geo: list, target: int) -> dict[str, torch.Tensor]:
    mode = Softmaxes()
    xin = x.clone().requires_grad_(True)
    with mode:
        out = model(xin)
    grads = [g.reshape(-1, *g.shape[-3:]) for g in torch.autograd.grad(out[:, target].sum(), mode.probs)]
    mode.probs = [p.reshape(-1, *p.shape[-3:]) for p in mode.probs]
    assert len(mode.probs) == len(geo)
    b = x.shape[0]
    maps = {}
    for name in ("rollout", "grad-rollout"):
        rows = []
        for i in range(b):
            r = None
            prev = None
            for p, g, gm in zip(mode.probs, grads, geo, strict=True):
                groups = p.shape[0] // b
                p, g = p.detach()[i * groups:(i + 1) * groups], g[i * groups:(i + 1) * groups]
                hw = gm[0] * gm[1]
                if name == "rollout":  # Abnar & Zuidema: norm(0.5 mean_h(A) + 0.5 I) on the dense matrix
                    m = 0.5 * dense(p.mean(1), gm) + 0.5 * torch.eye(hw, dtype=torch.float64)
                    m = m / m.sum(-1, keepdim=True)
                else:  # Chefer et al.: I + mean_h((grad * A)^+)
                    m = torch.eye(hw, dtype=torch.float64) + dense((g * p).clamp(min=0).mean(1), gm)
                if r is None:
                    r = m
                else:
                    if prev != gm[:2]:
                        r = pooling(prev, gm[:2]) @ r
                    r = m @ r
                prev = gm[:2]
            rows.append(r.mean(0).reshape(geo[0][0], geo[0][1]))
        maps[name] = torch.stack(rows)
    return maps


@pytest.mark.parametrize("family", ["torchvision", "torchvision-v2", "timm", "maxvit"])
def test_rollout_and_grad_rollout_equal_dense_products(family):
    model = {"torchvision": tv_swin, "torchvision-v2": tv_swin_v2, "timm": timm_swin, "maxvit": maxvit}[family]()
    x = torch.randn(2, 3, 40 if family != "maxvit" else 32, 40 if family != "maxvit" else 32,
                    generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if family == "maxvit":
        geo = maxvit_geometry(model)
    else:
        geo = swin_geometry(model, family != "timm")
    ref = dense_maps(model, x, geo, target=1)
    res = compute_attention(model, x, AttentionOptions(methods=("rollout", "grad-rollout")), target=1)
    assert res.grid == geo[0][:2]
    for name in ("rollout", "grad-rollout"):
        torch.testing.assert_close(res.maps[name].double(), ref[name], rtol=1e-5, atol=1e-7)
        assert float(ref[name].std()) > 0.01 * float(ref[name].mean())  # structure, far above the tolerance
    assert len({g[:2] for g in geo}) == 2  # two stages joined by a merge
    if family != "maxvit":  # and padding (10x10 and 5x5 maps in windows of 3 or 4)
        assert any(g[3] != g[:2] for g in geo)


def legrad_reference(model: nn.Module, x: torch.Tensor, geo: list, blocks: list[nn.Module], project,
                     target: int) -> torch.Tensor:
    """LeGrad (Bousselham et al. 2024) over ``blocks`` of the last stage, written out: the
    head on each block's output, its gradient at that block's probabilities, ReLU, mean over
    heads and queries, each window's keys put back on the map, the mean over the blocks."""
    outs: dict[nn.Module, torch.Tensor] = {}
    handles = [b.register_forward_hook(lambda m, a, o: outs.__setitem__(m, o)) for b in blocks]
    mode = Softmaxes()
    with mode:
        model(x)
    for h in handles:
        h.remove()
    probs = [p.reshape(-1, *p.shape[-3:]) for p in mode.probs]
    last = [i for i, g in enumerate(geo) if g[:2] == geo[-1][:2]]
    assert len(last) == len(blocks)
    maps = []
    for i, block in zip(last, blocks, strict=True):
        s = project(outs[block])[:, target].sum()
        g = torch.autograd.grad(s, mode.probs[i], retain_graph=True)[0].reshape(probs[i].shape)
        rel = g.clamp(min=0).mean(dim=(1, 2))  # (B * windows, N)
        h, w, win, (ph, pw) = geo[i]
        b = x.shape[0]
        flat = torch.zeros(b, ph * pw, dtype=torch.float64)
        flat[:, win.reshape(-1)] = rel.reshape(b, -1)
        maps.append(flat.reshape(b, ph, pw)[:, :h, :w])
    return torch.stack(maps).mean(0)


@pytest.mark.parametrize("family", ["torchvision", "timm", "maxvit"])
def test_legrad_on_the_last_stage_equals_the_written_out_rule(family):
    model = {"torchvision": tv_swin, "timm": timm_swin, "maxvit": maxvit}[family]()
    side = 32 if family == "maxvit" else 40
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    if family == "torchvision":
        geo, blocks = swin_geometry(model, True), list(model.features[-1])
        project = lambda t: model.head(model.flatten(model.avgpool(model.permute(model.norm(t)))))  # noqa: E731
    elif family == "timm":
        geo, blocks = swin_geometry(model, False), list(model.layers[-1].blocks)
        project = lambda t: model.forward_head(model.norm(t))  # noqa: E731
    else:
        geo = maxvit_geometry(model)
        last = model.blocks[-1].layers[-1].layers
        blocks, project = [last.window_attention, last.grid_attention], model.classifier
    ref = legrad_reference(model, x, geo, blocks, project, target=2)
    res = compute_attention(model, x, AttentionOptions(methods=("legrad",)), target=2)
    assert res.passes == {"forward": 1, "backward": 1}
    torch.testing.assert_close(res.maps["legrad"].double(), ref, rtol=1e-5, atol=1e-9)
    assert float(ref.std()) > 0.05 * float(ref.mean())


def test_legrad_refuses_an_earlier_stage():
    with pytest.raises(UsageError, match=r"legrad at 'features.1.0.attn': the model's head reads only the last "
                       r"stage's tokens .*choose layers of the last stage \(features.3.0.attn \.\.\)"):
        compute_attention(tv_swin(), torch.randn(1, 3, 40, 40, dtype=torch.float64),
                          AttentionOptions(methods=("legrad",), layers=("all",)))
