"""Video input: decoding only the frames needed, clip plans, the weights' preprocessing,
CAM over (T, H, W) checked against a hand computation and against a moving object, the
clip pictures, and the one-line errors for bad videos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixtures.videos import frame_index, moving_square, video_net_file, write_video
from inspect_model.errors import InputError
from inspect_model.loading import video
from inspect_model.loading.video import clip_indices, probe, read_frames
from inspect_model.methods.cam.maps import compute_cams

SCHEMAS = Path(__file__).resolve().parents[3] / "src" / "inspect_model" / "schemas"


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    frames = moving_square(40)
    return {s: write_video(d / f"clip{s}", frames) for s in (".mp4", ".mkv", ".webm", ".avi", ".gif", ".mov")}


@pytest.mark.parametrize("suffix", [".mp4", ".mkv", ".webm", ".avi", ".gif", ".mov"])
def test_seek_reads_the_frames_asked_for(videos: dict[str, Path], suffix: str) -> None:
    info = probe(videos[suffix])
    assert info.frames == 40 and info.fps == pytest.approx(10.0)
    got = read_frames(info, [3, 11, 25, 39])
    assert [f.index for f in got] == [3, 11, 25, 39]
    assert [frame_index(np.asarray(f.image)) for f in got] == [3, 11, 25, 39]  # the pixels say which frame
    assert [f.time for f in got] == pytest.approx([0.3, 1.1, 2.5, 3.9])


def test_decoding_stops_at_the_last_frame_and_starts_at_a_key_frame(tmp_path: Path, monkeypatch) -> None:
    path = write_video(tmp_path / "long.mp4", moving_square(120))  # a key frame every 8 frames
    decoded: list[int] = []
    orig = video._collect

    def spy(container, stream, wanted, index_of):
        class Counting:
            def decode(self, s):
                for f in container.decode(s):
                    decoded.append(1)
                    yield f
        return orig(Counting(), stream, wanted, index_of)

    monkeypatch.setattr(video, "_collect", spy)
    got = read_frames(probe(path), [100, 102])
    assert [frame_index(np.asarray(f.image)) for f in got] == [100, 102]
    assert len(decoded) <= 3 + 8  # from the key frame before 100 to 102, not the 103 frames before
    decoded.clear()
    read_frames(probe(path), [0, 1])
    assert len(decoded) == 2  # nothing after the last frame wanted


def test_clip_plans() -> None:
    assert clip_indices(40, 4, 2, 1) == [[16, 18, 20, 22]]  # the middle
    assert clip_indices(40, 4, 1, 3) == [[0, 1, 2, 3], [18, 19, 20, 21], [36, 37, 38, 39]]
    with pytest.raises(InputError, match=r"has 10 frame\(s\); 8 frames at --stride 2 span 15"):
        clip_indices(10, 8, 2, 1, name="video 'x.mp4'")


def test_video_preprocessing_equals_the_weights_transform(videos: dict[str, Path]) -> None:
    from torchvision.models.video import R3D_18_Weights

    from inspect_model.loading.clips import video_preprocess
    from inspect_model.loading.models import load_torchvision

    loaded = load_torchvision("r3d_18", weights=None, device="meta")
    pre = video_preprocess(loaded)
    frames = [f.image for f in read_frames(probe(videos[".mp4"]), list(range(5)))]
    ours = pre(frames)
    vid = torch.stack([torch.from_numpy(np.array(f)).permute(2, 0, 1) for f in frames])  # (T, C, H, W)
    ref = R3D_18_Weights.DEFAULT.transforms()(vid)
    assert ours.shape == ref.shape == (3, 5, 112, 112)
    torch.testing.assert_close(ours, ref)


class Net3d(nn.Module):
    def __init__(self, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(3, width, 3, padding=1)
        self.conv2 = nn.Conv3d(width, 6, 3, padding=1, stride=(2, 2, 2))
        self.fc = nn.Linear(6, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(a.mean(dim=(2, 3, 4)))


def test_gradcam3d_equals_a_hand_computation() -> None:
    torch.manual_seed(3)
    net = Net3d().eval()
    x = torch.randn(2, 3, 6, 12, 16)
    res = compute_cams(net, x, layers=["conv2"], methods=["gradcam", "hirescam", "layercam"], target=[[1], [2]])
    # Independent: the pieces run by hand, one full autograd.grad per sample.
    A = net.conv2(torch.relu(net.conv1(x))).detach().requires_grad_(True)  # the layer's output (N, C, t, h, w)
    scores = net.fc(torch.relu(A).mean(dim=(2, 3, 4)))
    for i, cls in enumerate((1, 2)):
        (G,) = torch.autograd.grad(scores[i, cls], A, retain_graph=True)
        w = G[i].mean(dim=(1, 2, 3))  # Grad-CAM's weights: the mean over (T, H, W)
        raw = {"gradcam": (w[:, None, None, None] * A[i]).sum(0), "hirescam": (G[i] * A[i]).sum(0),
               "layercam": (torch.relu(G[i]) * A[i]).sum(0)}
        for m in res.maps:
            if m.sample != i:
                continue
            want = raw[m.method].detach()
            torch.testing.assert_close(m.raw, want, rtol=1e-4, atol=1e-6)
            up = F.interpolate(torch.relu(want)[None, None], size=(6, 12, 16), mode="trilinear",
                               align_corners=False)[0, 0]
            up = (up - up.min()) / (up.max() - up.min())
            assert m.map.shape == (6, 12, 16)
            torch.testing.assert_close(m.map, up, rtol=1e-4, atol=1e-5)


def _moving(n: int, g: torch.Generator, T: int = 6, S: int = 16, SQ: int = 4) -> tuple[torch.Tensor, ...]:
    """Squares moving right (class 1) or left (class 0) over noise, and their centres per frame."""
    x = torch.rand(n, 1, T, S, S, generator=g) * 0.2
    y = torch.randint(0, 2, (n,), generator=g)
    pos = torch.zeros(n, T, 2, dtype=torch.long)
    for i in range(n):
        r = int(torch.randint(0, S - SQ, (1,), generator=g))
        c0 = int(torch.randint(0, S - SQ - 2 * T + 2, (1,), generator=g))
        for t in range(T):
            c = c0 + 2 * t if y[i] == 1 else c0 + 2 * (T - 1 - t)
            x[i, 0, t, r:r + SQ, c:c + SQ] = 1.0
            pos[i, t] = torch.tensor([r + SQ // 2, c + SQ // 2])
    return x, y, pos


def test_gradcam3d_follows_the_moving_object() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 8, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(8, 2))
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):  # a few seconds: direction of motion, learnt from the moving square
        x, y, _ = _moving(16, g)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    x, y, pos = _moving(8, torch.Generator().manual_seed(1))
    assert (net(x).argmax(1) == y).float().mean() >= 0.9
    res = compute_cams(net, x, layers=["2"], methods=["gradcam"], target=[[int(v)] for v in y])
    hits = total = 0
    for m in res.maps:
        for t in range(6):
            r, c = divmod(int(m.map[t].argmax()), 16)
            pr, pc = pos[m.sample, t].tolist()
            total += 1
            hits += abs(r - pr) <= 4 and abs(c - pc) <= 4
        peaks = [divmod(int(m.map[t].argmax()), 16)[1] for t in range(6)]
        step = 1 if int(y[m.sample]) == 1 else -1
        assert step * (peaks[-1] - peaks[0]) >= 6  # the peak travels with the square (10 px in 5 frames)
    assert hits / total >= 0.9


def _video_cli(cli, tmp_path: Path, videos: dict[str, Path], command: str, *extra: str) -> tuple[object, Path]:
    model = f"{video_net_file(tmp_path)}:build"
    out = tmp_path / f"out-{command}"
    r = cli([command, model, str(videos[".mp4"]), "--frames", "4", "--clips", "2", "--resize", "40", "--crop", "32",
             "-o", str(out), "--json", *extra])
    return r, out


def test_cam_on_clips_writes_strips_and_animations(cli, tmp_path: Path, videos: dict[str, Path]) -> None:
    import jsonschema
    from PIL import Image

    r, out = _video_cli(cli, tmp_path, videos, "cam", "--method", "gradcam,eigencam,scorecam")
    assert r.exit_code == 0, r.stderr
    assert "(2 image(s): " in r.stderr  # Score-CAM's count: the video's two clips, not one file
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / "cam.json").read_text())).validate(doc)
    assert [e["clip"]["frames"] for e in doc["images"]] == [[0, 1, 2, 3], [36, 37, 38, 39]]
    assert doc["images"][1]["clip"]["times"] == pytest.approx([3.6, 3.7, 3.8, 3.9])
    m = doc["images"][1]["maps"][0]
    assert m["clip"] == 1 and m["frames"] == [36, 37, 38, 39]
    gif = Image.open(out / m["files"]["animation"])
    assert gif.n_frames == 4
    assert (out / m["files"]["strip"]).is_file()
    assert doc["options"]["inputs"]["clips"] == {"frames": 4, "stride": 1, "clips": 2, "decoder": "PyAV"}


def test_activations_and_guided_backprop_on_clips(cli, tmp_path: Path, videos: dict[str, Path]) -> None:
    r, out = _video_cli(cli, tmp_path, videos, "activations", "-l", "features.2")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["images"][0]["clip"]["clip"] == 0
    assert (out / doc["images"][0]["files"]["features.2"]).is_file() if "features.2" in doc["images"][0]["files"] \
        else any(p.name.startswith("features.2") for p in out.rglob("*.png"))
    r, out = _video_cli(cli, tmp_path, videos, "guided-backprop")
    assert r.exit_code == 0, r.stderr
    files = json.loads(r.stdout)["images"][0]["maps"][0]["files"]
    assert {"guided_strip", "magnitude_strip", "magnitude_animation"} <= set(files)
    r, _ = _video_cli(cli, tmp_path, videos, "grads")
    assert r.exit_code == 0, r.stderr


def test_a_folder_of_frames_with_clip(cli, tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "frames"
    folder.mkdir()
    for i, f in enumerate(moving_square(12)):
        Image.fromarray(f).save(folder / f"f{i:03d}.png")
    r = cli(["cam", f"{video_net_file(tmp_path)}:build", str(folder), "--clip", "--frames", "4", "--stride", "3",
             "--resize", "40", "--crop", "32", "--json"])
    assert r.exit_code == 0, r.stderr
    clip = json.loads(r.stdout)["images"][0]["clip"]
    assert clip["frames"] == [1, 4, 7, 10] and clip["times"] == [None] * 4  # the middle 10 of 12 frames


def _bad(cli, tmp_path: Path, args: list[str], pattern: str, code: int = 4) -> None:
    out = tmp_path / "never"
    r = cli([*args, "-o", str(out)])
    assert r.exit_code == code, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and pattern in lines[-1], r.stderr
    assert not [ln for ln in lines if ln.startswith("Traceback")]
    assert not out.exists()


def test_bad_videos_are_one_line_and_write_nothing(cli, tmp_path: Path, videos: dict[str, Path]) -> None:
    model = f"{video_net_file(tmp_path)}:build"
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x01not a video at all" * 100)
    _bad(cli, tmp_path, ["activations", model, str(corrupt)], "corrupt")
    data = write_video(tmp_path / "whole.mp4", moving_square(40), faststart=True).read_bytes()
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(data[: len(data) // 2])  # the header still says 40 frames
    _bad(cli, tmp_path, ["activations", model, str(truncated), "--frames", "4", "--clips", "3"], "truncated")
    _bad(cli, tmp_path, ["activations", model, str(videos[".mp4"]), "--frames", "64"], "has 40 frame(s)")
    _bad(cli, tmp_path, ["activations", "resnet18", "--weights", "none", str(videos[".mp4"])],
         "an image model: give frames as images")
    img = Path(__file__).resolve().parents[3] / "sample_images" / "cat.jpg"
    _bad(cli, tmp_path, ["activations", model, str(img)], "is an image but")
    _bad(cli, tmp_path, ["activations", model, str(videos[".mp4"]), "--stride", "0"], "--stride must be 1 or more",
         code=2)


def test_activation_grids_of_clips_have_one_column_per_frame(cli, tmp_path: Path, videos: dict[str, Path]) -> None:
    r, out = _video_cli(cli, tmp_path, videos, "activations", "-l", "features.0")
    assert r.exit_code == 0, r.stderr
    grid = json.loads(r.stdout)["grids"][0]
    assert grid["kind"] == "frames" and grid["cols"] == 4, grid  # one column per frame of the clip
    assert (out / grid["file"]).is_file()


def test_labels_of_tiny_clips_fit_their_frames() -> None:
    """32-pixel frames are enlarged (whole factors, square pixels) so that 'frame N T.TTs'
    fits, on two lines if need be; the GIF's frames too; nothing is cut with an ellipsis."""
    import io

    from PIL import Image

    from inspect_model.render import raster
    from inspect_model.render.video import GIF_LEAST, STRIP_LEAST, animated_overlay, clip_strip, label_lines

    frames = [Image.new("RGB", (32, 24), (20 * i, 40, 90)) for i in range(10)]
    labels = [f"frame {i * 30 + 1000} {i * 3 + 100.25:.2f}s" for i in range(10)]
    strip = clip_strip(frames, labels, ["title"])
    assert strip.size[0] >= 8 * STRIP_LEAST
    for lab in labels:
        lines = label_lines(lab, 10, STRIP_LEAST)
        assert " ".join(lines) == lab and all(raster.text_size(t, 10)[0] <= STRIP_LEAST for t in lines)
    gif = Image.open(io.BytesIO(animated_overlay(frames, labels, 10.0)))
    assert gif.n_frames == 10 and max(gif.size) >= GIF_LEAST
    gif.seek(3)
    rgb = np.asarray(gif.convert("RGB"))
    assert (rgb[:, -1] == (20 * 3, 40, 90)).all(axis=-1).any()  # the frame shows beside the label box
    assert label_lines("frame 7 0.70s", 11, GIF_LEAST - 6) == ["frame 7 0.70s"]  # one line when it fits
