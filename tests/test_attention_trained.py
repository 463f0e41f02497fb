"""A tiny ViT trained in seconds on synthetic objects: the attention maps point at the object.

Images: 32x32 noise with one bright 10x10 shape at a random place; the class is the shape
(a filled 6x6 square, a ring, a cross: 36 pixels each, so the image's brightness does not
tell them apart; only the object does). Deletion/insertion are computed here independently of the tool's own
faithfulness code: pixels ranked by the map (blown up bilinearly), removed (set to 0, the
noise mean) or inserted (onto 0) in 8 steps, the target's softmax probability
averaged over the steps (the area under the curve)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from inspect_model.methods.attention import AttentionOptions, compute_attention

def _shapes() -> torch.Tensor:
    s = torch.zeros(3, 10, 10)
    s[0, 2:8, 2:8] = 1  # filled square
    s[1] = 1
    s[1, 1:9, 1:9] = 0  # ring
    s[2, 4:6, :] = 1
    s[2, :, 4:6] = 1  # cross
    assert (s.flatten(1).sum(1) == 36).all()
    return s


SHAPES = _shapes()
COLOURS = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]])


def make_batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 3, 32, 32, generator=g) * 0.3
    y = torch.randint(0, 3, (n,), generator=g)
    boxes = torch.randint(0, 22, (n, 2), generator=g)
    for i in range(n):
        r, c = boxes[i].tolist()
        x[i, :, r:r + 10, c:c + 10] = COLOURS[y[i]][:, None, None]
    return x, y, boxes


@functools.lru_cache(maxsize=1)
def trained() -> torch.nn.Module:
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        x, y, _ = make_batch(32, g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def up(m: torch.Tensor) -> torch.Tensor:
    return F.interpolate(m[:, None].float(), size=(32, 32), mode="bilinear", align_corners=False)[:, 0]


def curve_auc(model, x, y, m, insert: bool) -> float:
    order = up(m).flatten(1).argsort(dim=1, descending=True)  # most relevant first
    base = torch.zeros_like(x)
    aucs = []
    with torch.no_grad():
        for i in range(x.shape[0]):
            probs = []
            for k in range(0, 1025, 128):
                keep = torch.zeros(1024, dtype=torch.bool)
                keep[order[i, :k]] = True
                keep = keep.view(1, 32, 32)
                img = torch.where(keep, x[i], base[i]) if insert else torch.where(keep, base[i], x[i])
                probs.append(model(img[None]).softmax(1)[0, y[i]].item())
            aucs.append(sum(probs) / len(probs))
    return sum(aucs) / len(aucs)


def pointing(m: torch.Tensor, boxes: torch.Tensor) -> float:
    u = up(m)
    hits = 0
    for i in range(u.shape[0]):
        r, c = divmod(int(u[i].flatten().argmax()), 32)
        br, bc = boxes[i].tolist()
        hits += int(br <= r < br + 10 and bc <= c < bc + 10)
    return hits / u.shape[0]


@pytest.fixture(scope="module")
def results():
    model = trained()
    x, y, boxes = make_batch(24, torch.Generator().manual_seed(1))
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    res = compute_attention(model, x, AttentionOptions(methods=("all",), layers=("-1",)), target=y.tolist())
    return model, x, y, boxes, acc, res


def test_trained_model_learned(results):
    assert results[4] >= 0.9


@pytest.mark.parametrize("method", ["rollout", "grad-rollout", "legrad"])
def test_insertion_beats_deletion(results, method):
    model, x, y, _, _, res = results
    ins = curve_auc(model, x, y, res.maps[method], insert=True)
    dele = curve_auc(model, x, y, res.maps[method], insert=False)
    assert ins > dele, (method, ins, dele)


def test_grad_rollout_wins_pointing_game(results):
    _, _, _, boxes, _, res = results
    raw = res.raw[next(iter(res.raw))][:, 0]  # the last layer's class-token attention, heads averaged
    assert pointing(res.maps["grad-rollout"], boxes) > pointing(raw, boxes)
