"""A tiny ViT trained in seconds on synthetic objects: do the attention maps point at the evidence?

Images: 32x32 noise with two 10x10 squares of two different colours (red, green, blue) in
different places; the labels are the colours present (multi-label, sigmoid outputs). A map
is asked for one of the two colours, so a class-agnostic map (raw attention) can at best
pick either square, a class-specific one the right square.

Deletion/insertion are computed here independently of the tool's faithfulness code: pixels
ranked by the map (blown up bilinearly), removed (set to 0, the noise mean) or inserted
(onto 0) in 8 steps, the target's sigmoid averaged over the steps (the area under the
curve). The pointing game: a hit when the map's peak patch overlaps the target's square.

Why four layers (issue 26, item 2). Gradient rollout (Chefer et al. 2021) gives the class
row of R = (I + Ā_L) ... (I + Ā_1), Ā = E_h[(∇A ⊙ A)^+]; ours equals their formula and their
code (``test_grad_rollout_equals_chefer``: the logit's gradient, the clamp before the head
mean). On a two-layer toy it lost the pointing game to raw attention (0.31 against 0.33):
there the class row is Ā_2[0] + Ā_1[0] + (Ā_2 Ā_1)[0], and the two direct terms (the class
token's own attention, which this model does not use to find the square: 0.29 and 0.33 of
hits alone, on 96 images) outweigh the cross-layer term that follows the evidence through
the patch tokens (0.48 of hits alone) 250 to 400 times, because each Ā's class row sums to
only 0.05-0.08 (their product's, to 0.0002). That is the
rule working as written on a model too shallow for it, not a bug, and more training did not
change it (400 steps: 0.20 against 0.29 for the last layer's raw attention). With four layers (the
same data, 250 steps) the products carry weight: over three training seeds grad-rollout
hit 0.80, 0.57 and 0.97 against 0.52, 0.42 and 0.52 for raw attention's best layer.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from inspect_model.methods.attention.maps import AttentionOptions
from inspect_model.methods.attention.passes import compute_attention

COLOURS = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]])
SIDE, OBJ, PATCH = 32, 10, 4


def make_batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images, multi-hot labels, the colour to explain, and its square's top-left corner."""
    x = torch.randn(n, 3, SIDE, SIDE, generator=g) * 0.3
    labels = torch.zeros(n, 3)
    a = torch.randint(0, 3, (n,), generator=g)
    b = (a + torch.randint(1, 3, (n,), generator=g)) % 3
    boxes = torch.randint(0, SIDE - OBJ, (n, 2), generator=g)
    for i in range(n):
        r, c = boxes[i].tolist()
        dr, dc = (r + 11 + int(torch.randint(0, 6, (1,), generator=g))) % 22, (c + 11) % 22
        x[i, :, dr:dr + OBJ, dc:dc + OBJ] = COLOURS[b[i]][:, None, None]
        x[i, :, r:r + OBJ, c:c + OBJ] = COLOURS[a[i]][:, None, None]  # drawn last: never covered
        labels[i, a[i]] = labels[i, b[i]] = 1
    return x, labels, a, boxes


@functools.lru_cache(maxsize=1)
def trained() -> torch.nn.Module:
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = VisionTransformer(image_size=SIDE, patch_size=PATCH, num_layers=4, num_heads=2, hidden_dim=32,
                              mlp_dim=64, num_classes=3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(250):
        x, labels, _, _ = make_batch(32, g)
        loss = F.binary_cross_entropy_with_logits(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def up(m: torch.Tensor) -> torch.Tensor:
    return F.interpolate(m[:, None].float(), size=(SIDE, SIDE), mode="bilinear", align_corners=False)[:, 0]


def curve_auc(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, m: torch.Tensor, insert: bool) -> float:
    order = up(m).flatten(1).argsort(dim=1, descending=True)  # most relevant first
    rows = torch.arange(x.shape[0])
    scores = []
    with torch.no_grad():
        for k in range(0, SIDE * SIDE + 1, SIDE * SIDE // 8):
            keep = torch.zeros(x.shape[0], SIDE * SIDE, dtype=torch.bool)
            keep[rows[:, None], order[:, :k]] = True
            keep = keep.view(-1, 1, SIDE, SIDE)
            img = torch.where(keep, x, 0.0) if insert else torch.where(keep, 0.0, x)
            scores.append(model(img).sigmoid()[rows, target])
    return torch.stack(scores).mean().item()  # the mean over images of each curve's mean


def pointing(m: torch.Tensor, boxes: torch.Tensor) -> float:
    hits = 0
    for i in range(m.shape[0]):
        r, c = divmod(int(m[i].flatten().argmax()), m.shape[-1])
        br, bc = boxes[i].tolist()
        hits += int(r * PATCH < br + OBJ and br < (r + 1) * PATCH and c * PATCH < bc + OBJ and bc < (c + 1) * PATCH)
    return hits / m.shape[0]


# Every test here reads one model trained for 250 steps (the module fixture: ~25 s on an idle
# 2-core machine, 178 s under load), so the whole module is in the slow tier (issue 35: the quick
# tier under 2 minutes); README's full run still runs it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results():
    model = trained()
    x, labels, target, boxes = make_batch(48, torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = ((model(x) > 0).float() == labels).all(1).float().mean().item()
    res = compute_attention(model, x, AttentionOptions(methods=("all",), layers=("all",)), target=target.tolist())
    raw = [r[:, 0] for r in res.raw.values()]  # each layer's class-token attention, heads averaged
    return model, x, target, boxes, exact, res, raw


def test_trained_model_learned(results):
    assert results[4] >= 0.9


@pytest.mark.parametrize("method", ["rollout", "grad-rollout", "legrad"])
def test_insertion_beats_deletion(results, method):
    model, x, target, _, _, res, _ = results
    ins = curve_auc(model, x, target, res.maps[method], insert=True)
    dele = curve_auc(model, x, target, res.maps[method], insert=False)
    assert ins > dele, (method, ins, dele)


@pytest.mark.parametrize("method", ["grad-rollout", "legrad"])
def test_wins_pointing_game_over_raw_attention_of_every_layer(results, method):
    _, _, _, boxes, _, res, raw = results
    assert len(raw) == 4
    best_raw = max(pointing(r, boxes) for r in raw)
    assert pointing(res.maps[method], boxes) > best_raw, (method, pointing(res.maps[method], boxes), best_raw)
