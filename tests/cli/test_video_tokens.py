"""``activations`` on video transformers (issue 25): MViT's tokens and Swin3D's channels-last
stages are drawn as per-frame grids on their (T, H, W) layout, as 3-D conv maps are, and the
report's layer rows and grids say the layout. Tiny stand-ins named as torchvision's classes
(the layout is read off the class, as for the real models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fixtures.videos import moving_square, write_video

MODELS = '''
import torch
from torch import nn


class MViT(nn.Module):
    """(N, 3, T, H, W) -> a class token + (T/2 * H/4 * W/4) patch tokens of 8 dims, like MViT."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv_proj = nn.Conv3d(3, 8, (3, 4, 4), stride=(2, 4, 4), padding=(1, 0, 0))
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.blocks = nn.ModuleList([nn.Linear(8, 8)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = self.conv_proj(x).flatten(2).transpose(1, 2)  # (N, t*h*w, 8), row-major over (t, h, w)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1)
        for b in self.blocks:
            t = b(t)
        return self.head(t[:, 0])


class SwinTransformer3d(nn.Module):
    """A stage that outputs (N, t, h, w, C), channels last, as torchvision's Swin3D."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv3d(3, 6, (2, 4, 4), stride=(2, 4, 4))
        self.stage = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        y = self.stage(self.patch(x).permute(0, 2, 3, 4, 1))  # (N, t, h, w, C)
        return self.head(y.mean(dim=(1, 2, 3)))


def mvit():
    return MViT().eval()


def swin():
    return SwinTransformer3d().eval()
'''
SCHEMA = Path(__file__).resolve().parents[2] / "src" / "inspect_model" / "schemas" / "activations.json"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tokens")
    (d / "vt.py").write_text(MODELS)
    return {"models": d / "vt.py", "video": write_video(d / "v.mp4", moving_square(12, size=(48, 64)))}


def test_mvit_tokens_are_laid_on_their_frames_grid(files: dict[str, Path]) -> None:
    """As_frames against the layout by hand: token 1 + (t*h + y)*w + x is frame t's (y, x)."""
    from inspect_model.methods.cam.video import as_frames, clip_layout

    space: dict = {}
    exec(compile(MODELS, "vt", "exec"), space)  # noqa: S102 - the test's own model source
    model = space["mvit"]()
    x = torch.randn(1, 3, 4, 16, 24)
    tokens = model.blocks[0](torch.cat([model.cls, model.conv_proj(x).flatten(2).transpose(1, 2)], 1))
    lay = clip_layout(model, "blocks.0", tuple(tokens.shape), (4, 16, 24))
    assert (lay.kind, lay.grid, lay.prefix) == ("tokens", (2, 4, 6), 1)
    frames = as_frames(tokens[0], lay)  # (D, t, h, w)
    assert frames.shape == (8, 2, 4, 6)
    for t, y, xx in ((0, 0, 0), (1, 2, 5), (1, 3, 0)):
        torch.testing.assert_close(frames[:, t, y, xx], tokens[0, 1 + (t * 4 + y) * 6 + xx])


@pytest.mark.parametrize(("factory", "layer", "layout"), [
    ("mvit", "blocks.0", {"kind": "tokens", "grid": [2, 8, 8], "prefix_tokens": 1, "channels": 8,
                          "note": "129 tokens on a 2x8x8 (frames, h, w) grid, class token dropped"}),
    ("swin", "stage", {"kind": "nthwc", "grid": [2, 8, 8], "prefix_tokens": 0, "channels": 6,
                       "note": "(frames, h, w, channels) output on a 2x8x8 grid, channels last"}),
])
def test_activations_draw_per_frame_grids_of_transformer_outputs(cli, tmp_path: Path, files: dict[str, Path],
                                                                factory: str, layer: str, layout: dict) -> None:
    import jsonschema
    from PIL import Image

    out = tmp_path / "out"
    r = cli(["activations", f"{files['models']}:{factory}", str(files["video"]), "--frames", "4", "--resize", "40",
             "--crop", "32", "-l", layer, "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    row = next(x for x in doc["layers"] if x["name"] == layer)
    assert row["layout"] == layout
    grid = doc["grids"][0]
    assert (grid["kind"], grid["cols"], grid["rows"]) == ("frames", 2, layout["channels"])  # a column per frame
    assert grid["note"] == f"2 of 2 frames; {layout['note']}"
    assert f"note: layer {row['key']}: {layout['note']}" in r.stderr
    assert Image.open(out / grid["file"]).size[0] > 100
