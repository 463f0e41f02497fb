"""Pictures (issue 15): the fast paths draw what matplotlib would, deterministically, and the
Sink writes them on a bounded pool of threads."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inspect_model.errors import OutputError
from inspect_model.render import raster
from inspect_model.output.files import OutputDir, png_bytes
from inspect_model.output.sink import MAX_PENDING, Sink


def test_lookup_table_gives_matplotlibs_colours() -> None:
    import matplotlib

    v = np.linspace(0, 1, 1001, dtype=np.float32)
    for name in ("jet", "viridis", "inferno"):
        want = (matplotlib.colormaps[name](v)[:, :3] * 255 + 0.5).astype(np.uint8)
        got = raster.colorize(v, name)
        assert got.shape == (1001, 3) and np.abs(got.astype(int) - want).max() <= 1
    assert (raster.colorize(np.array([np.nan, -1.0, 2.0]), "jet") ==
            raster.colorize(np.array([0.0, 0.0, 1.0]), "jet")).all()


def test_heat_map_and_overlay_are_deterministic_and_say_when_constant() -> None:
    from inspect_model.render import overlay as ov

    m = np.random.default_rng(0).random((16, 16)).astype(np.float32)
    a = png_bytes(ov.heatmap_image(m, "gradcam @ l\n3 cat p=0.5"))
    assert a == png_bytes(ov.heatmap_image(m.copy(), "gradcam @ l\n3 cat p=0.5"))
    flat = ov.heatmap_image(np.zeros((16, 16), np.float32), "gradcam @ l\n3 cat p=0.5")
    assert flat.size[0] >= 224 and raster.constant_note(np.zeros(4)) == "all values are 0: nothing to show"
    picture = Image.new("RGB", (40, 30), (128, 128, 128))
    over = ov.overlay(picture, m, (10, 0, 40, 30))
    arr = np.asarray(over)
    assert over.size == (40, 30) and (arr[:, :10] == 70).all()  # outside the crop: dimmed, no heat


def test_contact_sheet_labels_every_row_and_column() -> None:
    from inspect_model.render.overlay import SheetCell, contact_sheet, thumbnail

    land = thumbnail(Image.new("RGB", (400, 200), (200, 50, 50)))
    rows = [(f"a_long_landscape_name_{i}.jpg #1", [SheetCell(land, "281 tabby p=0.5"), None]) for i in range(3)]
    sheet = contact_sheet(rows, ["gradcam @ layer4", "scorecam @ layer4"], title="page 1")
    w, h = sheet.size
    # Dense: a landscape row is as tall as its thumbnail (80 px), not a square cell.
    assert h < 60 + 3 * (land.size[1] + 40) and w < 150 + 2 * 170
    ink = (np.asarray(sheet.convert("L"))[:, :150] < 128)
    for i in range(3):  # a row label beside every row
        top = 60 + i * (land.size[1] + 22)
        assert ink[top - 20: top + land.size[1] + 20].any()


def test_contact_sheet_column_titles_stay_in_their_columns() -> None:
    """Long bold headers ("gradcam @ backbone.fpn" beside "layercam @ backbone.fpn") are
    wrapped at a word and ellipsised per column: no ink crosses a column's edge."""
    from inspect_model.render.overlay import THUMB, SheetCell, contact_sheet, thumbnail

    cols = ["gradcam @ backbone.fpn", "layercam @ backbone.fpn", "gradcam++ @ backbone.fpn",
            "scorecam @ model.encoder.layers.11.attention.output.dense"]
    cell = SheetCell(thumbnail(Image.new("RGB", (300, 200), (90, 90, 200))), "89 0.01")
    sheet = contact_sheet([("cat.jpg #1", [cell] * len(cols))], cols, title="class activation maps (page 1)")
    fs, pad, label_w, cell_w = 12, 4, 150, THUMB + 4  # contact_sheet's layout
    head_h = (fs + 4) * 2 + 2 * pad
    head = np.asarray(sheet.convert("L"))[fs + 10: fs + 10 + head_h - 4]  # below the title, above the rule
    for ci in range(len(cols) + 1):  # each column edge, and a pixel either side, is blank in the header
        x = label_w + ci * cell_w
        assert (head[:, max(x - 1, 0): x + 2] > 200).all(), (ci, cols[ci - 1] if ci else None)
    for ci in range(len(cols)):
        assert (head[:, label_w + ci * cell_w + 8: label_w + (ci + 1) * cell_w - 8] < 128).any()  # a title is there
    lines = [raster.wrap_text(c, fs, cell_w - 2 * pad, max_lines=2, bold=True) for c in cols]
    assert lines[0] == ["gradcam @", "backbone.fpn"] and lines[1] == ["layercam @", "backbone.fpn"]
    assert lines[3][-1].count("…") == 1
    assert all(raster.text_size(t, fs, True)[0] <= cell_w - 2 * pad for ls in lines for t in ls)


def test_activation_pictures_strips_and_all_zero() -> None:
    from inspect_model.render.grids import render_activation

    img, layout = render_activation(np.zeros((16, 7, 7), np.float32), 0, title="dead")
    assert layout.kind == "grid" and img.size[0] > 200
    img, layout = render_activation(np.arange(10.0), None, title="fc")
    assert (layout.kind, layout.rows, layout.cols) == ("strip", 1, 10)
    a = np.random.default_rng(1).standard_normal((64, 56, 56)).astype(np.float32)
    one, _ = render_activation(a, 0, title="t")
    two, _ = render_activation(a.copy(), 0, title="t")
    assert png_bytes(one) == png_bytes(two)


def test_histogram_pages_cover_every_layer() -> None:
    from types import SimpleNamespace

    from inspect_model.methods.gradients.stats import HIST_BINS, LogHist
    from inspect_model.render.gradients import HIST_PER_PAGE, histogram_pages

    counts = [0] * HIST_BINS
    counts[HIST_BINS // 2] = 5
    hist = LogHist(counts=counts, zeros=1, min=-3.0, max=-2.0)
    layers = [SimpleNamespace(key=f"l{i}", grad_output=object(), hist=hist) for i in range(HIST_PER_PAGE + 3)]
    layers.append(SimpleNamespace(key="unreached", grad_output=None, hist=LogHist()))
    pages = histogram_pages(SimpleNamespace(layers=layers))
    assert len(pages) == 2 and pages[0].size == pages[1].size[:1] + (pages[0].size[1],)


def test_sink_writes_in_parallel_with_a_bounded_queue(tmp_path: Path) -> None:
    out = OutputDir(tmp_path / "o").prepare()
    sink = Sink(out, workers=2)
    gate = threading.Event()
    running = []

    def slow() -> Image.Image:
        running.append(1)
        gate.wait(5)
        return Image.new("RGB", (4, 4))

    names = [sink.image(f"images/{i:04d}.png", slow) for i in range(MAX_PENDING)]
    blocked = threading.Thread(target=lambda: sink.image("images/last.png", slow))
    blocked.start()
    time.sleep(0.3)
    assert blocked.is_alive()  # the queue is full: the producer waits (bounded memory)
    gate.set()
    blocked.join(5)
    sink.drain()
    sink.close()
    assert names[0] == "images/0000.png" and not blocked.is_alive()
    assert sorted(sink.written()) == sorted([*names, "images/last.png"])
    out.commit()
    assert all((tmp_path / "o" / n).is_file() for n in names)


def test_sink_raises_a_workers_error_and_leaves_nothing(tmp_path: Path) -> None:
    from inspect_model.run.pipeline import execute
    from inspect_model.run.session import ImageItem, Result, Session
    from inspect_model.output.sink import Drawer

    class Boom(Drawer):
        def draw(self, item, sink):  # type: ignore[no-untyped-def]
            def boom() -> Image.Image:
                raise OutputError("cannot draw")

            return {"f": sink.image("a.png", boom)}

    class Failing(Session):
        command = "x"
        drawer = Boom()

        def run(self, batches, handle):  # type: ignore[no-untyped-def]
            handle(ImageItem({"index": 0}))

        def finish(self):  # type: ignore[no-untyped-def]
            return Result("x", {}, {})

    with pytest.raises(OutputError, match="cannot draw"):
        execute(Failing(), [], output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA", "P", "1", "I;16"])
@pytest.mark.parametrize("photo", [False, True])
@pytest.mark.parametrize("deflate", ["isal", "zlib"])
def test_png_bytes_decode_to_the_same_pixels(mode: str, photo: bool, deflate: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Our PNG encoder (Sub filter + ISA-L's deflate, or zlib's where isal is missing) is
    read back by Pillow pixel for pixel, for every mode it encodes and the ones it hands to
    Pillow; the same pixels give the same bytes; zlib's own decoder checks the stream and
    each chunk's CRC is checked by hand."""
    import io
    import struct
    import zlib

    if deflate == "zlib":
        monkeypatch.setitem(sys.modules, "isal", None)  # import isal fails: the fallback
    else:
        pytest.importorskip("isal")

    rng = np.random.default_rng(3)
    rgba = rng.integers(0, 256, (37, 53, 4), dtype=np.uint8)
    rgba[:10] = 7  # a flat band: runs for the compressor
    base = Image.fromarray(rgba, "RGBA")
    img = base.convert(mode) if mode != "I;16" else Image.fromarray(rgba[..., 0].astype(np.uint16) * 257)
    data = png_bytes(img, photo=photo)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data == png_bytes(img.copy(), photo=photo)
    back = Image.open(io.BytesIO(data))
    back.load()
    assert back.size == img.size
    assert np.array_equal(np.asarray(back.convert(img.mode)), np.asarray(img))
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    if img.mode in ("L", "LA", "RGB", "RGBA"):  # ours: one Sub-filtered row after another
        rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(img.size[1], -1)
        assert (rows[:, 0] == 1).all()


def test_every_png_of_cam_and_grads_is_byte_identical_across_runs(tmp_path: Path) -> None:
    """Issue 15: the same run twice gives the same bytes in every picture (overlays, heat
    maps, contact sheets, gradient-flow plot, histogram pages), whatever order the render
    threads finish in."""
    import torch

    import inspect_model as im
    from conftest import SAMPLE_IMAGES
    from fixtures.models import TinyCNN
    from inspect_model.run.options import InputOptions

    images = sorted(str(p) for p in SAMPLE_IMAGES.glob("*.jpg"))
    model = TinyCNN(in_ch=3, classes=5, width=4).eval()
    opts = {"resize": 40, "crop": 32, "batch_size": 3}
    outs = []
    for run in ("a", "b"):
        torch.manual_seed(0)
        im.cam(model, methods=["gradcam", "gradcam++"], inputs=InputOptions(images, **opts),
               output_dir=tmp_path / run / "cam")
        im.grads(model, inputs=InputOptions(images, **opts), output_dir=tmp_path / run / "grads")
        outs.append(tmp_path / run)
    pngs = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*.png"))
    assert len(pngs) == len(images) * 2 * 2 + 1 + 2  # overlay + heat map per image and method, sheet, flow, hist
    assert any("contact_sheet" in str(p) for p in pngs) and any("grad_flow" in str(p) for p in pngs)
    for rel in pngs:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


def test_an_overlay_of_a_large_photo_is_reduced_and_keeps_its_crop_box() -> None:
    """A 12-megapixel original would cost seconds and megabytes per overlay: it is reduced to
    OVERLAY_SIDE on its long side, and the crop box scales with it (heat inside, dimmed outside)."""
    from inspect_model.render import overlay as ov

    picture = Image.new("RGB", (3000, 2000), (200, 200, 200))
    m = np.ones((8, 8), np.float32)  # full heat: jet's dark red inside the box
    over = ov.overlay(picture, m, (0, 0, 1500, 2000))  # the model saw the left half
    assert over.size == (ov.OVERLAY_SIDE, round(2000 * ov.OVERLAY_SIDE / 3000))
    a = np.asarray(over).astype(int)
    half = ov.OVERLAY_SIDE // 2
    assert (a[:, : half - 2, 0] > a[:, : half - 2, 2] + 50).all()  # red heat on the left
    assert (a[:, half + 2:] == round(200 * 0.55)).all()  # dimmed grey on the right
    small = Image.new("RGB", (400, 300))
    assert ov.overlay(small, m).size == (400, 300)  # smaller originals keep their size


def test_cam_on_a_large_photo_writes_a_reduced_overlay_and_records_the_original_size(tmp_path: Path) -> None:
    import inspect_model as im
    from fixtures.models import TinyCNN
    from inspect_model.run.options import InputOptions
    from inspect_model.render.overlay import OVERLAY_SIDE

    photo = tmp_path / "big.jpg"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (1800, 2600, 3), dtype=np.uint8)).save(photo, quality=80)
    res = im.cam(TinyCNN(in_ch=3, classes=5, width=4).eval(), inputs=InputOptions([str(photo)], resize=40, crop=32),
                 output_dir=tmp_path / "o")
    entry = res.to_dict()["images"][0]
    assert entry["size"] == [2600, 1800]  # the report keeps the original's size
    over = Image.open(tmp_path / "o" / entry["maps"][0]["files"]["overlay"])
    assert over.size == (OVERLAY_SIDE, round(1800 * OVERLAY_SIDE / 2600))


def test_render_threads_run_at_a_lower_priority_than_the_model(tmp_path: Path) -> None:
    import os
    import sys

    from inspect_model.output.sink import RENDER_NICE

    out = OutputDir(tmp_path / "o").prepare()
    sink = Sink(out, workers=1)
    main = os.getpriority(os.PRIO_PROCESS, 0)
    seen = sink.defer(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
    sink.close()
    out.abort()
    assert os.getpriority(os.PRIO_PROCESS, 0) == main  # the process itself is untouched
    if sys.platform.startswith("linux"):
        assert seen == max(main, RENDER_NICE)  # lower, never higher, than the rest
