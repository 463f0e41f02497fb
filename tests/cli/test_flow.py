"""Optical-flow models (RAFT): pairs of images or of video frames, every command at a small
size, the flow picture, and the explained score (mean flow magnitude of the final prediction)
checked against RAFT run by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.videos import moving_square, write_video

SAMPLE = Path(__file__).resolve().parents[2] / "sample_images" / "cat.jpg"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from PIL import Image

    d = tmp_path_factory.mktemp("pair")
    im = Image.open(SAMPLE).convert("RGB").resize((200, 128))
    a, b = d / "a.png", d / "b.png"
    im.crop((0, 0, 128, 128)).save(a)
    im.crop((6, 0, 134, 128)).save(b)  # the scene moved 6 px to the left
    return a, b


COMMANDS = [["summary", "--input-size", "3x128x128", "--input-size", "3x128x128"], ["activations", "-l", "update_block"],
            ["check"], ["grads"], ["guided-backprop"], ["cam"]]


@pytest.mark.parametrize("args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_raft_small_runs_every_command(cli, tmp_path: Path, pair: tuple[Path, Path], args: list[str]) -> None:
    images = [] if args[0] == "summary" else [str(p) for p in pair]
    out = tmp_path / "out"
    r = cli([args[0], "raft_small", "--weights", "none", *images, *args[1:], "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    if args[0] in ("activations", "guided-backprop", "cam"):
        entry = doc["images"][0]
        assert entry["pair"] == {"images": [str(pair[0]), str(pair[1])]}
        assert (out / entry["files"]["flow"]).is_file()  # flow_to_image of the final prediction
    if args[0] == "cam":
        assert doc["layers"][0]["name"] == "context_encoder"
        assert entry["maps"][0]["target"]["label"] == "mean_flow_magnitude"


def test_the_explained_score_is_the_mean_flow_magnitude(pair: tuple[Path, Path]) -> None:
    from PIL import Image
    from torchvision.models.optical_flow import raft_small
    from torchvision.transforms import functional as F

    import inspect_model as im

    torch.manual_seed(0)
    model = raft_small(weights=None).eval()
    res = im.guided_backprop(model, [str(p) for p in pair])
    got = res.to_dict()["images"][0]["maps"][0]["target"]["score"]
    # By hand: torchvision's OpticalFlow transform ([-1, 1]), RAFT's last prediction, |flow| averaged.
    x1, x2 = ((F.pil_to_tensor(Image.open(p).convert("RGB")).float() / 255 * 2 - 1)[None] for p in pair)
    with torch.no_grad():
        flow = model(x1, x2)[-1]
    want = float(flow.pow(2).sum(1).sqrt().mean())
    assert got == pytest.approx(want, rel=1e-4)


def test_pairs_of_video_frames(cli, tmp_path: Path) -> None:
    frames = [np.asarray(torch.nn.functional.interpolate(torch.from_numpy(f).permute(2, 0, 1)[None].float(),
                                                        size=(128, 128))[0].permute(1, 2, 0).byte())
              for f in moving_square(12)]
    path = write_video(tmp_path / "v.mp4", frames)
    r = cli(["activations", "raft_small", "--weights", "none", str(path), "--frames", "3", "--stride", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    pairs = [e["pair"] for e in json.loads(r.stdout)["images"]]
    assert [p["frames"] for p in pairs] == [[3, 5], [5, 7]]
    assert pairs[0]["times"] == pytest.approx([0.3, 0.5])


def test_odd_image_count_is_one_line(cli, tmp_path: Path, pair: tuple[Path, Path]) -> None:
    out = tmp_path / "never"
    third = tmp_path / "c.png"
    third.write_bytes(pair[0].read_bytes())
    r = cli(["activations", "raft_small", "--weights", "none", str(pair[0]), str(pair[1]), str(third),
             "-o", str(out)])
    assert r.exit_code == 4
    assert r.stderr.strip().splitlines()[-1] == (
        "error: a flow model takes pairs of images: 3 image(s) given, an odd number; give an even number "
        "(1-2, 3-4, ...) or a video")
    assert not out.exists()


def test_boxes_make_the_score_the_flow_inside_them(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    from PIL import Image
    from torchvision.models.optical_flow import raft_small
    from torchvision.transforms import functional as F

    import inspect_model as im

    torch.manual_seed(0)
    model = raft_small(weights=None).eval()
    boxes = tmp_path / "boxes.csv"
    boxes.write_text(f"image,x0,y0,x1,y1\n{pair[0].name},10,20,70,90\n")
    doc = im.cam(model, [str(p) for p in pair], boxes=str(boxes)).to_dict()
    got = doc["images"][0]["maps"][0]["target"]["score"]
    x1, x2 = ((F.pil_to_tensor(Image.open(p).convert("RGB")).float() / 255 * 2 - 1)[None] for p in pair)
    with torch.no_grad():
        mag = model(x1, x2)[-1].pow(2).sum(1).sqrt()[0]  # (H, W)
    assert got == pytest.approx(float(mag[20:90, 10:70].mean()), rel=1e-4)
    assert got != pytest.approx(float(mag.mean()), rel=1e-3)
    assert doc["options"]["boxes"] == str(boxes)


def test_scorecam_refuses_pairs(cli) -> None:
    r = cli(["cam", "raft_small", "--weights", "none", "--input-size", "3x128x128", "--method", "scorecam"])
    assert r.exit_code == 2 and "Score-CAM and --evaluate perturb the input" in r.stderr.strip().splitlines()[-1]
