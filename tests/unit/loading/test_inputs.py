"""Inputs people really have (issue 3, issue 9): paths from files, folders, globs and stdin;
exotic and broken images; preprocessing geometry; batching equal to one at a time."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fixtures.models import TinyCNN
from inspect_model.errors import EXIT_INPUT, InputError, UsageError
from inspect_model.loading.images import collect_paths, load_image
from inspect_model.loading.inputs import Preprocess, build_preprocess, model_channels, plan_inputs
from inspect_model.loading.loaded import LoadedModel


def rgb(path: Path, size=(40, 30), color=(200, 30, 30), fmt: str | None = None) -> Path:
    arr = np.zeros((size[1], size[0], 3), np.uint8)
    arr[...] = color
    arr[:, : size[0] // 2] = (10, 200, 10)  # left half green: orientation is visible
    Image.fromarray(arr).save(path, format=fmt)
    return path


def loaded_tiny(in_ch: int = 3) -> LoadedModel:
    torch.manual_seed(0)
    return LoadedModel(model=TinyCNN(in_ch=in_ch).eval(), name="TinyCNN", source="python")


# ---------------------------------------------------------------- paths
def test_collect_files_dirs_globs(tmp_path: Path) -> None:
    d = tmp_path / "data"
    (d / "b" / "deep").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for rel in ["z.png", "a.jpg", "b/c.PNG", "b/deep/d.webp", ".hidden/x.png", "._a.jpg", "notes.txt"]:
        (d / rel).write_bytes(b"x")
    got = collect_paths([str(d)])
    assert [p.relative_to(d).as_posix() for p in got] == ["a.jpg", "b/c.PNG", "b/deep/d.webp", "z.png"]
    assert collect_paths([str(d / "*.jpg")]) == [d / "a.jpg"]
    assert [p.name for p in collect_paths([str(d / "**" / "*.png")])] == ["z.png"]
    # Named twice (a file and its folder): kept once, where it first appears.
    assert collect_paths([str(d / "z.png"), str(d)])[0] == d / "z.png"
    assert len(collect_paths([str(d / "z.png"), str(d)])) == 4
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="directory '.*empty' holds no images"):
        collect_paths([str(tmp_path / "empty")])
    with pytest.raises(InputError, match="pattern '.*\\*.gif' matches no file"):
        collect_paths([str(d / "*.gif")])
    with pytest.raises(InputError, match="image '.*nope.png' does not exist"):
        collect_paths([str(d / "nope.png")])


def test_collect_from_stdin(tmp_path: Path) -> None:
    a, b = rgb(tmp_path / "a.png"), rgb(tmp_path / "b b.png")
    assert collect_paths(["-"], stdin=io.StringIO(f"{a}\r\n\n{b}\n")) == [a, b]
    assert collect_paths(["-"], stdin=io.StringIO(f"{b}\0{a}\0")) == [b, a]  # find -print0
    with pytest.raises(InputError, match="stdin holds no image paths"):
        collect_paths(["-"], stdin=io.StringIO("\n  \n"))


def test_cli_stdin_and_empty_stdin(tmp_path: Path, models_py: Path, cli) -> None:

    res = cli(["cam", f"{models_py}:TinyCNN", "-", "--weights", "none"], stdin="")
    assert res.exit_code == EXIT_INPUT, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "error: '-' was given but stdin holds no image paths (one per line)"
    )
    bad = tmp_path / "bad.jpg"
    bad.write_text("not a jpeg")
    res = cli(["cam", f"{models_py}:TinyCNN", "-", "--weights", "none"], stdin=f"{bad}\n")
    assert res.exit_code == EXIT_INPUT and str(bad) in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------------------- decoding and conversion
def test_exif_orientation_applied(tmp_path: Path) -> None:
    img = Image.open(rgb(tmp_path / "src.png", size=(16, 8)))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = tmp_path / "rotated.jpg"
    img.save(path, exif=exif.tobytes(), quality=95)
    li = load_image(path)
    arr = np.asarray(li.image)
    # Stored 16x8 with the left half green; shown 8x16 with the top half green.
    assert li.image.size == (8, 16)
    assert arr[2, 4, 1] > 150 and arr[13, 4, 0] > 150


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK", "1", "LA", "I;16", "I", "F"])
def test_modes_convert(tmp_path: Path, mode: str) -> None:
    base = Image.open(rgb(tmp_path / "src.png", size=(12, 10)))
    if mode == "I;16":
        arr = np.full((10, 12), 65535, np.uint16)
        arr[:, :6] = 32896  # 32896 / 65535 * 255 = 128.0
        img = Image.fromarray(arr)  # uint16 -> I;16
    elif mode == "I":
        img = Image.fromarray(np.full((10, 12), 40000, np.int32), mode="I")
    elif mode == "F":
        img = Image.fromarray(np.full((10, 12), 0.5, np.float32), mode="F")
    else:
        img = base.convert(mode)
    fmt = {"CMYK": "JPEG", "F": "TIFF", "I": "TIFF"}.get(mode, "PNG")
    path = tmp_path / f"img.{fmt.lower()}"
    img.save(path, format=fmt)
    li = load_image(path)
    assert li.image.mode == "RGB" and li.image.size == (12, 10)
    assert load_image(path, channels=1).image.mode == "L"
    px = np.asarray(li.image).astype(int)
    if mode == "I;16":
        assert li.original_mode.startswith("I;16")
        assert px[0, 0].tolist() == [128, 128, 128] and px[0, 11].tolist() == [255, 255, 255]
    elif mode == "I":
        assert px[0, 0].tolist() == [156] * 3  # 40000 / 65535 * 255 = 155.6
    elif mode == "F":
        assert px[0, 0].tolist() == [128] * 3  # 0.5 of [0, 1]
    elif mode == "CMYK":
        assert abs(px[5, 1] - [10, 200, 10]).max() < 40 and abs(px[5, 10] - [200, 30, 30]).max() < 40


def test_transparency_composited_on_white(tmp_path: Path) -> None:
    arr = np.zeros((10, 10, 4), np.uint8)
    arr[:, :5] = (255, 0, 0, 255)  # opaque red left, transparent right
    path = tmp_path / "alpha.png"
    Image.fromarray(arr, "RGBA").save(path)
    px = np.asarray(load_image(path).image)
    assert px[0, 0].tolist() == [255, 0, 0] and px[0, 9].tolist() == [255, 255, 255]


def test_grayscale_model_gets_one_channel(tmp_path: Path) -> None:
    loaded = loaded_tiny(in_ch=1)
    assert model_channels(loaded.model) == 1
    p = rgb(tmp_path / "c.png", size=(32, 32))
    plan = plan_inputs(loaded, [str(p)], crop=16, resize=16)
    (b,) = list(plan.batches())
    assert b.tensor.shape == (1, 1, 16, 16)
    assert loaded.model(b.tensor).shape == (1, 5)


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims width x height pixels, with almost no data: cheap to make,
    ruinous to decode."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def _truncated_jpeg(path: Path) -> Path:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(buf, "JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def _corrupt_png(path: Path) -> Path:
    """A real PNG whose compressed pixel data is overwritten: the header reads, decoding fails."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (32, 32, 3), np.uint8)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    start = data.index(b"IDAT") + 8
    data[start : start + 200] = b"\xff" * 200
    path.write_bytes(bytes(data))
    return path


BAD_IMAGES = {
    "empty.png": (lambda p: p.write_bytes(b"") and p, "is an empty file"),
    "text.jpg": (lambda p: p.write_text("just some text"), "is not an image Pillow can read"),
    "noise.png": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4), "not an image"),
    "broken.png": (lambda p: _corrupt_png(p), "corrupt or truncated"),
    "trunc.jpg": (_truncated_jpeg, "corrupt or truncated"),
    "tiny.png": (lambda p: Image.new("RGB", (1, 1)).save(p), r"is 1x1 pixels, smaller than 8x8"),
    "bomb.png": (lambda p: _png_header_only(p, 20000, 20000),
                 r"is 20000x20000 pixels, over the 89,478,485-pixel safety limit"),
}


@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_bad_images_name_the_file(tmp_path: Path, name: str) -> None:
    make, pattern = BAD_IMAGES[name]
    path = tmp_path / name
    make(path)
    with pytest.raises(InputError, match=pattern) as exc:
        load_image(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_bomb_is_refused_without_allocating_pixels(tmp_path: Path) -> None:
    path = _png_header_only(tmp_path / "bomb.png", 20000, 20000)
    tracemalloc.start()
    try:
        with pytest.raises(InputError):
            load_image(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000  # decoding would take 1.2 GB


def test_animated_gif_first_frame_with_warning(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (16, 16), c) for c in [(255, 0, 0), (0, 0, 255), (0, 255, 0)]]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)
    li = load_image(path)
    assert np.asarray(li.image)[0, 0].tolist() == [255, 0, 0]
    assert li.warnings == [f"'{path}' has 3 frames; using the first"]
    plan = plan_inputs(loaded_tiny(), [str(path)], crop=16, resize=16)
    list(plan.batches())
    assert plan.warnings == li.warnings


# ---------------------------------------------------------------- skipping bad inputs
def test_skip_bad_inputs_counts_and_reports(tmp_path: Path) -> None:
    good = [rgb(tmp_path / f"g{i}.png") for i in range(3)]
    bad = tmp_path / "b.jpg"
    bad.write_text("nope")
    paths = [str(good[0]), str(bad), str(good[1]), str(good[2])]
    with pytest.raises(InputError, match="b.jpg' is not an image"):
        list(plan_inputs(loaded_tiny(), paths, crop=16, resize=16).batches())
    plan = plan_inputs(loaded_tiny(), paths, crop=16, resize=16, batch_size=2, skip_bad=True)
    names = [n for b in plan.batches() for n in b.names]
    assert names == [str(good[0]), str(good[1]), str(good[2])]
    assert plan.processed == 3 and len(plan.paths) == 4
    assert len(plan.skipped) == 1 and plan.skipped[0][0] == str(bad) and "not an image" in plan.skipped[0][1]
    all_bad = plan_inputs(loaded_tiny(), [str(bad), str(bad)], skip_bad=True)
    with pytest.raises(InputError, match="none of the 1 images could be read"):
        list(all_bad.batches())


# ---------------------------------------------------------------- batching and geometry
def test_batching_equals_one_at_a_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate([(40, 30), (30, 50), (64, 64), (33, 17), (20, 20)]):
        p = tmp_path / f"im{i}.png"
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), np.uint8)).save(p)
        paths.append(str(p))
    loaded = loaded_tiny()
    batched = list(plan_inputs(loaded, paths, resize=20, crop=16, batch_size=2).batches())
    single = list(plan_inputs(loaded, paths, resize=20, crop=16, batch_size=1).batches())
    assert [len(b.names) for b in batched] == [2, 2, 1] and len(single) == 5
    xb = torch.cat([b.tensor for b in batched])
    xs = torch.cat([b.tensor for b in single])
    assert torch.equal(xb, xs)
    with torch.no_grad():
        yb = torch.cat([loaded.model(b.tensor) for b in batched])
        ys = torch.cat([loaded.model(b.tensor) for b in single])
    torch.testing.assert_close(yb, ys, rtol=1e-5, atol=1e-6)
    # Independent: resize + crop + normalise written out with torchvision directly.
    from torchvision.transforms import functional as F

    img = Image.open(paths[1]).convert("RGB")
    t = F.center_crop(F.resize(img, 20), [16, 16])
    ref = F.normalize(F.pil_to_tensor(t).float() / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    torch.testing.assert_close(xs[1], ref)


def test_no_crop_still_gives_stackable_batches(tmp_path: Path) -> None:
    paths = [str(rgb(tmp_path / f"{i}.png", size=s)) for i, s in enumerate([(40, 20), (40, 20), (20, 40), (40, 20)])]
    plan = plan_inputs(loaded_tiny(), paths, preset="unit", batch_size=8)
    batches = list(plan.batches())
    # Different shapes cannot share a batch: a batch ends where the size changes.
    assert [tuple(b.tensor.shape) for b in batches] == [(2, 3, 20, 40), (1, 3, 40, 20), (1, 3, 20, 40)]
    assert sum(len(b.names) for b in batches) == 4
    plan = plan_inputs(loaded_tiny(), paths, resize=16, crop=None, preset="unit", batch_size=8)
    assert [tuple(b.tensor.shape) for b in plan.batches()] == [(2, 3, 16, 32), (1, 3, 32, 16), (1, 3, 16, 32)]


def test_uncrop_box_hand_computed() -> None:
    pre = Preprocess(resize=256, crop=224)
    # 400x200: scale 256/200 = 1.28 -> 512x256; crop 224 at left (512-224)/2 = 144, top 16.
    assert pre.uncrop_box(400, 200) == pytest.approx((112.5, 12.5, 287.5, 187.5))
    assert Preprocess(resize=None, crop=None).uncrop_box(30, 20) == (0.0, 0.0, 30.0, 20.0)


def test_uncrop_box_matches_pixels(tmp_path: Path) -> None:
    """A marker pixel at the crop's centre lands at the centre of the model input."""
    pre = Preprocess(resize=64, crop=32, mean=(0, 0, 0), std=(1, 1, 1), interpolation="nearest")
    arr = np.zeros((100, 200, 3), np.uint8)
    left, top, right, bottom = pre.uncrop_box(200, 100)
    cx, cy = int((left + right) / 2), int((top + bottom) / 2)
    arr[cy - 2 : cy + 2, cx - 2 : cx + 2] = 255
    t = pre(Image.fromarray(arr))
    ys, xs = torch.nonzero(t[0] > 0.5, as_tuple=True)
    assert abs(ys.float().mean().item() - 15.5) <= 1.0 and abs(xs.float().mean().item() - 15.5) <= 1.0


def test_preprocess_options_and_presets() -> None:
    assert build_preprocess(preset="inception").crop == 299
    p = build_preprocess(resize=100, crop=80, mean=[0.5], std=[0.25])
    assert (p.resize, p.crop, p.mean, p.std, p.source) == (100, 80, (0.5,), (0.25,), "options")
    with pytest.raises(UsageError, match="--preset 'imgnet' is not one of"):
        build_preprocess(preset="imgnet")
    with pytest.raises(UsageError, match="--std values must not be 0"):
        build_preprocess(std=[0.0, 1.0, 1.0])
    with pytest.raises(InputError, match="--batch-size must be 1 or more, got 0"):
        plan_inputs(loaded_tiny(), None, input_size="3x8x8", batch_size=0)


def test_synthetic_input_is_seeded() -> None:
    loaded = loaded_tiny()
    a = next(plan_inputs(loaded, None, input_size="3x8x8", seed=5, batch_size=2).batches()).tensor
    b = next(plan_inputs(loaded, None, input_size="3x8x8", seed=5, batch_size=2).batches()).tensor
    c = next(plan_inputs(loaded, None, input_size="3x8x8", seed=6, batch_size=2).batches()).tensor
    assert torch.equal(a, b) and not torch.equal(a, c)
    z = next(plan_inputs(loaded, None, input_size="3x8x8", fill="zeros").batches()).tensor
    assert not z.any()
    with pytest.raises(InputError, match="input size of TinyCNN is unknown"):
        plan_inputs(loaded, None)
