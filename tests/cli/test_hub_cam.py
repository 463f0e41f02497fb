"""``--layer auto`` on timm's and Hugging Face's ViT, DeiT, Swin and ConvNeXt (tiny configs,
random weights): the layer picked, the token grid, and a map that is not constant."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

from inspect_model.methods.cam.maps import compute_cams


def _timm(name: str, **kw):
    return timm.create_model(name, pretrained=False, **kw).eval()


def _hf(config_cls: str, model_cls: str, **kw):
    cfg = getattr(transformers, config_cls)(**kw)
    return getattr(transformers, model_cls)(cfg).eval()


CASES = {
    # name: (build, input side, expected layer, expected kind, grid, prefix tokens)
    "timm-vit": (lambda: _timm("test_vit"), 160, "blocks.{}.norm1", "tokens", (10, 10), 1),
    "timm-deit-distilled": (
        lambda: _timm("deit_tiny_distilled_patch16_224", img_size=64, depth=2, embed_dim=24, num_heads=2),
        64, "blocks.1.norm1", "tokens", (4, 4), 2),
    "timm-swin": (
        lambda: _timm("swin_tiny_patch4_window7_224", img_size=56, window_size=7, embed_dim=12,
                      depths=(1, 1), num_heads=(1, 2)),
        56, "layers.1", "nhwc", (7, 7), 0),
    "timm-convnext": (lambda: _timm("test_convnext"), 160, "stages.{}", "nchw", None, 0),
    "hf-vit": (lambda: _hf("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, hidden_size=16,
                           num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, num_labels=5),
               32, "layernorm_before", "tokens", (4, 4), 1),
    "hf-deit": (lambda: _hf("DeiTConfig", "DeiTForImageClassification", image_size=32, patch_size=8,
                            hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                            num_labels=5),
                32, "layernorm_before", "tokens", (4, 4), 2),
    "hf-swin": (lambda: _hf("SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=8,
                            depths=[1, 1], num_heads=[1, 2], window_size=4, num_labels=5),
                32, "swin.layernorm", "tokens", (4, 4), 0),
    "hf-convnext": (lambda: _hf("ConvNextConfig", "ConvNextForImageClassification", num_stages=2,
                                hidden_sizes=[8, 16], depths=[1, 1], num_labels=5),
                    64, "convnext.encoder.stages.1", "nchw", (8, 8), 0),  # stem /4, one downsampling stage
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_layer_and_grid(case):
    build, side, layer, kind, grid, prefix = CASES[case]
    torch.manual_seed(0)
    model = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, side, side)
    res = compute_cams(model, x, methods=["gradcam"])
    (got,) = res.layers
    if "{}" in layer:
        n = len(model.blocks) if hasattr(model, "blocks") else len(model.stages)
        layer = layer.format(n - 1)
    assert got.name == layer or (got.name.endswith(layer) and case.startswith("hf")), got.name
    assert got.layout.kind == kind
    if grid is not None:
        assert tuple(got.layout.grid) == grid
    assert got.layout.prefix == prefix
    assert len(res.maps) == 2
    for cam in res.maps:
        assert cam.map.shape == (side, side) and cam.raw is not None
        assert torch.isfinite(cam.raw).all() and float(cam.raw.max() - cam.raw.min()) > 0
    # The model is given back as it was.
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not model.training
