"""CAM-family maps inside an attention run (``--method rollout,grad-rollout,gradcam``).

They come from the attention run's own forward pass and the backward pass grad-rollout
runs; checked against pytorch-grad-cam's GradCAM on the same ViT, layer and class (with the
token-grid reshape of its ViT tutorial) and, exactly, against ``cam``'s ``compute_cams``
(itself checked against pytorch-grad-cam); the attention maps are unchanged by adding them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inspect_model.methods.attention.maps import AttentionOptions
from inspect_model.methods.attention.passes import compute_attention
from inspect_model.methods.cam.maps import compute_cams


def vit() -> torch.nn.Module:
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=16, mlp_dim=32,
                          num_classes=5).eval().double()
    torch.nn.init.normal_(m.heads.head.weight)  # torchvision starts it at zero: every score would be flat
    return m


def x_batch(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)


def test_gradcam_in_the_attention_run_equals_pytorch_grad_cam():
    gc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model, x = vit(), x_batch()
    res = compute_attention(model, x, AttentionOptions(methods=("rollout", "grad-rollout", "gradcam")), target=3)
    assert res.cam_layer == "encoder.layers.encoder_layer_2.ln_1" and res.passes == {"forward": 1, "backward": 1}

    def reshape(t: torch.Tensor) -> torch.Tensor:  # pytorch-grad-cam's ViT tutorial: drop the class token
        return t[:, 1:, :].reshape(t.shape[0], 4, 4, t.shape[2]).permute(0, 3, 1, 2)

    with gc.GradCAM(model=model, target_layers=[model.encoder.layers.encoder_layer_2.ln_1],
                    reshape_transform=reshape) as cam:
        ref = cam(input_tensor=x, targets=[ClassifierOutputTarget(3)] * 3)  # (N, 32, 32) in [0, 1]
    for i in range(3):
        ours = torch.nn.functional.interpolate(res.maps["gradcam"][i][None, None].double(), size=(32, 32),
                                               mode="bilinear", align_corners=False)[0, 0].numpy()
        r = np.corrcoef(ref[i].ravel(), ours.ravel())[0, 1]
        assert r >= 0.99, (i, r)


def test_cam_methods_equal_compute_cams_and_leave_attention_maps_alone():
    model, x = vit(), x_batch()
    names = ("gradcam", "gradcam++", "xgradcam", "layercam", "hirescam")
    both = compute_attention(model, x, AttentionOptions(methods=("rollout", "grad-rollout", *names)), target=1)
    alone = compute_attention(model, x, AttentionOptions(methods=("rollout", "grad-rollout")), target=1)
    cams = compute_cams(model, x, methods=names, target=[1, 1, 1])
    for c in cams.maps:
        torch.testing.assert_close(both.maps[c.method][c.sample].double(), c.raw.double().relu(), rtol=1e-6,
                                   atol=1e-9)
    for name in ("rollout", "grad-rollout"):
        assert torch.equal(both.maps[name], alone.maps[name])
    # CAM methods alone: one forward, one backward for the gradient ones, none for Eigen-CAM
    only = compute_attention(model, x, AttentionOptions(methods=("gradcam",)), target=1)
    torch.testing.assert_close(only.maps["gradcam"], both.maps["gradcam"])
    assert only.passes == {"forward": 1, "backward": 1}
    eigen = compute_attention(model, x, AttentionOptions(methods=("eigencam",)), target=1)
    assert eigen.passes == {"forward": 1, "backward": 0}
    ref = compute_cams(model, x, methods=("eigencam",), target=[1, 1, 1])
    for c in ref.maps:
        torch.testing.assert_close(eigen.maps["eigencam"][c.sample].double(), c.raw.double().relu())


def test_swin_rollout_beside_gradcam_at_the_last_stage():
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=[3, 3],
                            num_classes=3).eval().double()
    x = torch.randn(2, 3, 40, 40, dtype=torch.float64)
    flags = [p.requires_grad for p in model.parameters()]
    res = compute_attention(model, x, AttentionOptions(methods=("rollout", "grad-rollout", "legrad", "gradcam")),
                            target=2)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())  # given back
    assert [p.requires_grad for p in model.parameters()] == flags and all(p.grad is None for p in model.parameters())
    assert res.cam_layer == "features.3" and res.maps["gradcam"].shape == (2, 5, 5)
    assert res.passes == {"forward": 1, "backward": 2}
    assert res.maps["rollout"].shape == (2, 10, 10)
    cams = compute_cams(model, x, methods=("gradcam",), target=[2, 2])
    for c in cams.maps:
        torch.testing.assert_close(res.maps["gradcam"][c.sample].double(), c.raw.double().relu())
