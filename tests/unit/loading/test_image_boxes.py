"""Detection boxes on the original picture (``image_box`` beside ``box``).

``box`` is where the model found a detection, in model-input pixels; with ``--resize``/
``--crop`` (or a segmenter's own resize) that is not the picture's frame, which ``--boxes``
takes and the pictures draw. Every box record also carries the box on the picture. The
expected values here are written out from the picture's size and the preprocessing's
numbers (shorter side to ``resize``, a centre crop of ``crop``), not read from the code's
mapping; and a box given on the picture must come back as given.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import run_cli
from fixtures import dense as D

# A 288x192 picture: the 96x96 scene at twice its size, between two 48-pixel bands. Resizing
# the shorter side to 96 halves it (144x96) and the centre crop of 96 starts at 24 in the
# resized picture: the model sees the scene at its training scale.
WIDTH, HEIGHT, RESIZE, CROP = 288, 192, 96, 96
FLAGS = ["--resize", str(RESIZE), "--crop", str(CROP), "--mean", "0", "--std", "1"]


def expected_image_box(box: list[float]) -> list[float]:
    """Input pixels -> picture pixels, from the preprocessing's numbers."""
    scale = RESIZE / min(WIDTH, HEIGHT)  # resized = picture * scale
    left = (WIDTH * scale - CROP) / 2  # the crop's corner in the resized picture
    top = (HEIGHT * scale - CROP) / 2
    x0, y0, x1, y1 = box
    return [(x0 + left) / scale, (y0 + top) / scale, (x1 + left) / scale, (y1 + top) / scale]


@pytest.fixture(scope="module")
def picture(tmp_path_factory) -> tuple[Path, list[tuple[list[float], int]]]:
    """The wide picture and its objects' boxes in the picture's pixels."""
    img, objects = D.scene(90001)
    scene = Image.fromarray((img.permute(1, 2, 0).numpy() * 255).astype("uint8")).resize((192, 192), Image.NEAREST)
    canvas = Image.new("RGB", (WIDTH, HEIGHT), (20, 20, 20))
    canvas.paste(scene, (48, 0))
    p = tmp_path_factory.mktemp("wide") / "wide.png"
    canvas.save(p)
    return p, [([48 + 2 * box[0], 2 * box[1], 48 + 2 * box[2], 2 * box[3]], label) for box, label in objects]


@pytest.fixture(scope="module")
def dense_py(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("dense") / "dense_models.py"
    p.write_text("from fixtures.dense import tiny_detector, tiny_segmenter\n"
                 "def detector():\n    return tiny_detector()\n"
                 "def segmenter():\n    return tiny_segmenter(0)\n")
    return p


def _json(res) -> dict:
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def _validate(command: str, doc: dict) -> None:
    import jsonschema

    from inspect_model.schemas import load_schema

    jsonschema.validate(doc, load_schema(command))


def _iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_expected_mapping_is_not_the_identity():
    """The test's own numbers: the crop starts 48 pixels in and the scale is 2."""
    assert expected_image_box([0, 0, 96, 96]) == [48, 0, 240, 192]


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_cam_detections_carry_their_box_on_the_picture(dense_py, picture, tmp_path):
    path, objects = picture
    doc = _json(run_cli(["cam", f"{dense_py}:detector", str(path), *FLAGS, "-m", "gradcam",
                         "--score-threshold", "0.3", "--json", "-o", str(tmp_path / "o")]))
    _validate("cam", doc)
    (entry,) = doc["images"]
    assert entry["size"] == [WIDTH, HEIGHT]
    assert entry["detections"] and entry["predictions"]
    records = entry["detections"] + entry["predictions"] + [m["detection"] for m in entry["maps"]]
    for rec in records:
        assert rec["image_box"] == pytest.approx(expected_image_box(rec["box"]), abs=1e-4)
    for rec in entry["detections"]:
        assert rec["matched_box"] is None and rec["matched_image_box"] is None
    # the model found the objects where they are in the picture (the picture's own boxes)
    found = [d["image_box"] for d in entry["detections"]]
    for box, _label in objects:
        assert max(_iou(box, f) for f in found) > 0.5, (box, found)


def test_boxes_given_on_the_picture_come_back_as_given(dense_py, picture, tmp_path):
    path, objects = picture
    box, label = objects[0]
    given = [box[0] + 3.5, box[1] - 2.25, box[2] + 1.0, box[3] + 4.75]  # off the input's pixel grid
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("image,x0,y0,x1,y1,label\n" f"{path.name},{','.join(str(v) for v in given)},{label}\n")
    doc = _json(run_cli(["cam", f"{dense_py}:detector", str(path), *FLAGS, "-m", "gradcam",
                         "--score-threshold", "0.3", "--boxes", str(boxes), "--json"]))  # no pictures: not read
    _validate("cam", doc)
    (det,) = doc["images"][0]["detections"]
    assert det["class"] == label and det["iou"] > 0.5
    assert det["matched_image_box"] == pytest.approx(given, abs=1e-3)
    assert expected_image_box(det["matched_box"]) == pytest.approx(given, abs=1e-3)
    assert det["image_box"] == pytest.approx(expected_image_box(det["box"]), abs=1e-4)
    text = run_cli(["cam", f"{dense_py}:detector", str(path), *FLAGS, "-m", "gradcam",
                    "--score-threshold", "0.3", "--boxes", str(boxes)])
    assert text.exit_code == 0, text.stderr
    shown = "box [" + ", ".join(f"{v:.0f}" for v in det["image_box"]) + "]"  # the text prints the picture's box
    assert shown in text.stdout.replace("\n", " "), text.stdout


def test_guided_backprop_detections_carry_their_box_on_the_picture(dense_py, picture):
    path, _ = picture
    doc = _json(run_cli(["guided-backprop", f"{dense_py}:detector", str(path), *FLAGS,
                         "--score-threshold", "0.5", "--max-detections", "2", "--json"]))
    _validate("guided-backprop", doc)
    maps = doc["images"][0]["maps"]
    assert maps
    for m in maps:
        det = m["detection"]
        assert det["image_box"] == pytest.approx(expected_image_box(det["box"]), abs=1e-4)
        assert det["matched_image_box"] is None


def test_segmentation_region_on_the_picture(dense_py, picture, tmp_path):
    """A segmenter with --boxes: the region the mask is limited to, in both frames."""
    path, _ = picture
    given = [70.0, 20.5, 180.25, 150.0]
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps({path.name: [given]}))
    doc = _json(run_cli(["cam", f"{dense_py}:segmenter", str(path), *FLAGS, "-m", "gradcam",
                         "--boxes", str(boxes), "--json", "-o", str(tmp_path / "o")]))
    _validate("cam", doc)
    segments = doc["images"][0]["segments"]
    assert segments
    for seg in segments:
        assert seg["image_region"] == pytest.approx(given, abs=1e-3)
        assert expected_image_box(seg["region"]) == pytest.approx(given, abs=1e-3)


def test_tensor_input_has_no_picture_box(tmp_path):
    """Through the API with a tensor there is no picture: image_box is null, box is kept."""
    import inspect_model as im

    img, _ = D.scene(90002)
    res = im.cam(D.tiny_detector(), img[None], methods=["gradcam"], score_threshold=0.5, max_detections=1,
                 output_dir=str(tmp_path / "o"))
    doc = res.to_dict()
    _validate("cam", doc)
    entry = doc["images"][0]
    assert entry["detections"]
    for rec in entry["detections"] + entry["predictions"]:
        assert rec["box"] is not None and rec["image_box"] is None
    assert all(d["matched_image_box"] is None for d in entry["detections"])


def test_frame_of_a_squashing_preprocess():
    """timm/HF processors may resize both sides (squash): x and y scale differently."""
    from inspect_model.loading.geometry import picture_frame
    from inspect_model.loading.preprocess import Preprocess

    pic = Image.fromarray(np.zeros((100, 200, 3), dtype=np.uint8))  # 200 wide, 100 high
    frame = picture_frame(Preprocess(resize=64, crop=None, squash=True), pic, (64, 64))
    assert frame is not None
    assert frame.to_picture([16, 16, 48, 32]) == pytest.approx([16 * 200 / 64, 16 * 100 / 64,
                                                                48 * 200 / 64, 32 * 100 / 64])
    back = frame.from_picture(frame.to_picture([1.5, 2.5, 30.0, 40.0]))
    assert list(back) == pytest.approx([1.5, 2.5, 30.0, 40.0], abs=1e-9)
    assert picture_frame(None, None, (64, 64)) is None


@pytest.mark.parametrize("size,resize,crop,squash", [
    ((250, 150), 80, 64, False),  # resized 133.3 -> 133 wide, the crop starts at 34.5 -> 34
    ((151, 257), 97, 60, False),  # portrait, odd sides
    ((250, 150), 64, None, False),  # a segmenter's resize without a crop
    ((250, 150), 90, 120, False),  # a crop larger than the resized picture: padded
    ((250, 150), 75, 60, True),  # both sides resized (timm/HF processors)
])
def test_crop_box_is_where_the_input_pixels_come_from(size, resize, crop, squash):
    """The input's box on the picture, measured through the real preprocessing: each pixel
    of a float picture holds its own x (another picture: y), a linear ramp, which a bilinear
    resize keeps linear away from the borders; input pixel j then holds the picture's x at
    its centre less 0.5, so a line fitted to (j + 0.5, value + 0.5) gives the crop's left
    edge and its scale."""
    from inspect_model.loading.preprocess import Preprocess

    w, h = size
    pre = Preprocess(resize=resize, crop=crop, mean=(0,), std=(1,), interpolation="bilinear", squash=squash)
    ramps = [np.broadcast_to(np.arange(w, dtype=np.float32)[None, :], (h, w)),  # x (float: no rounding)
             np.broadcast_to(np.arange(h, dtype=np.float32)[:, None], (h, w))]  # y
    t = [pre(Image.fromarray(np.ascontiguousarray(r), mode="F"))[0] * 255 for r in ramps]  # (H_in, W_in) each
    hin, win = t[0].shape
    left, top, right, bottom = pre.uncrop_box(w, h)
    for axis, (lo, hi, n) in enumerate([(left, right, win), (top, bottom, hin)]):
        line = (t[0][hin // 2, :] if axis == 0 else t[1][:, win // 2]).numpy()  # a middle row / column
        centres = np.arange(n) + 0.5
        real = np.flatnonzero(line > 0.5)  # padding is 0 (and so is the picture's first pixel: left out too)
        real = real[3:-3]  # the resampling filter is cut at the picture's borders
        slope, intercept = np.polyfit(centres[real], line[real] + 0.5, 1)
        assert slope == pytest.approx((hi - lo) / n, abs=2e-3), (axis, slope)
        assert intercept == pytest.approx(lo, abs=0.25), (axis, intercept, lo)
