"""Detectors and segmenters are fed as torchvision feeds them, not like classifiers.

A detector resizes and normalises inside the model and takes the whole image in [0, 1]
(torchvision's ``ObjectDetection`` preset); a segmenter's ``SemanticSegmentation`` preset
resizes the shorter side to 520 and normalises, with no crop. The classifier's centre crop
would cut off part of the picture that boxes, masks and maps are drawn on. Checked here
against torchvision's own transforms (independently of our ``Preprocess``), and end to end:
the model gets the image as it is, the boxes in the report are in the original image's
pixels, and the pictures cover the whole, uncropped image.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from PIL import Image

from fixtures import dense as D
from inspect_model.loading.inputs import plan_inputs, preprocess_from_weights
from inspect_model.loading.sources.torchvision import load_torchvision

CAT = Path(__file__).resolve().parents[3] / "sample_images" / "cat.jpg"  # 451x300: not square


def _fed(name: str) -> tuple[torch.Tensor, dict]:
    """The tensor ``plan_inputs`` feeds torchvision model ``name`` (random weights) for cat.jpg."""
    loaded = load_torchvision(name, weights=None, device="meta")  # only its classes are read
    plan = plan_inputs(loaded, [str(CAT)])
    (batch,) = list(plan.batches())
    return batch.tensor[0], plan.describe()


def test_segmenter_without_weights_gets_torchvision_segmentation_preset():
    from torchvision.transforms._presets import SemanticSegmentation

    x, described = _fed("lraspp_mobilenet_v3_large")
    want = SemanticSegmentation(resize_size=520)(Image.open(CAT).convert("RGB"))
    assert x.shape == want.shape == (3, 520, 781)  # shorter side 520, nothing cut off
    torch.testing.assert_close(x, want, atol=1e-6, rtol=0)
    assert described["preprocessing"]["crop"] is None and described["input_size"] is None


def test_detector_without_weights_gets_the_image_as_it_is():
    from torchvision.transforms.functional import to_tensor

    x, described = _fed("fasterrcnn_mobilenet_v3_large_320_fpn")
    torch.testing.assert_close(x, to_tensor(Image.open(CAT).convert("RGB")), atol=0, rtol=0)
    pre = described["preprocessing"]
    assert (pre["resize"], pre["crop"], pre["mean"], pre["std"]) == (None, None, [0.0] * 3, [1.0] * 3)


@pytest.mark.parametrize("module", ["detection", "segmentation"])
def test_every_weights_transform_is_followed(module):
    """Where weights exist, their own transforms() (metadata: nothing is downloaded) decide,
    for every detection and segmentation model of the registry."""
    import torchvision

    img = Image.open(CAT).convert("RGB")
    names = torchvision.models.list_models(module=getattr(torchvision.models, module))
    assert names
    for name in names:
        transforms = torchvision.models.get_model_weights(name).DEFAULT.transforms()
        pre = preprocess_from_weights(transforms)
        assert pre is not None and pre.crop is None, name
        torch.testing.assert_close(pre(img), transforms(img), atol=1e-6, rtol=0, msg=name)


def test_explicit_options_still_win():
    loaded = load_torchvision("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, device="meta")
    plan = plan_inputs(loaded, [str(CAT)], resize=96, crop=96, mean=[0.5], std=[0.5])
    (batch,) = list(plan.batches())
    assert batch.tensor.shape == (1, 3, 96, 96) and plan.describe()["input_size"] == [3, 520, 520]


def _wide_scene(tmp_path: Path) -> tuple[Path, list[tuple[list[float], int]]]:
    """Two synthetic scenes side by side (96x192), drawn at twice the size: a 384x192 picture,
    and its objects' boxes in the picture's pixels."""
    (a, oa), (b, ob) = D.scene(90001), D.scene(90002)
    img = torch.cat([a, b], dim=2)  # (3, 96, 192)
    objects = [([v * 2 for v in box], lab) for box, lab in oa]
    objects += [([(box[0] + 96) * 2, box[1] * 2, (box[2] + 96) * 2, box[3] * 2], lab) for box, lab in ob]
    p = tmp_path / "wide.png"
    Image.fromarray((img.permute(1, 2, 0).numpy() * 255).astype("uint8")).resize((384, 192), Image.NEAREST).save(p)
    return p, objects


def _iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_detector_boxes_and_pictures_are_in_the_original_image(tmp_path):
    """The tiny trained detector on a non-square picture at twice its training scale (it
    resizes by 1/2 inside): the model gets the picture itself, every object is found at its
    place in the picture's pixels, and every overlay is the whole picture."""
    import inspect_model as im
    from torchvision.transforms.functional import to_tensor

    model = copy.deepcopy(D.tiny_detector())
    model.transform.max_size = 192  # the 96x192 scene at its training scale
    path, objects = _wide_scene(tmp_path)
    fed: list[torch.Tensor] = []
    handle = model.register_forward_pre_hook(lambda m, args: fed.append(args[0][0].detach().clone()))
    try:
        res = im.cam(model, [str(path)], methods=["layercam"], score_threshold=0.5, max_detections=4,
                     output_dir=str(tmp_path / "o"))
    finally:
        handle.remove()
    picture = Image.open(path).convert("RGB")
    torch.testing.assert_close(fed[0], to_tensor(picture), atol=0, rtol=0)
    doc = res.to_dict()
    (entry,) = doc["images"]
    assert entry["size"] == [384, 192]
    boxes = [d["box"] for d in entry["detections"]]
    for box, label in objects:
        assert max(_iou(box, b) for b in boxes) > 0.5, (box, boxes)
    for mp in entry["maps"]:
        assert mp["stats"]["peak_in_box"]
        assert Image.open(tmp_path / "o" / mp["files"]["overlay"]).size == (384, 192)


@pytest.mark.slow  # a detector run with pictures; the cam test above covers the same preprocessing quickly
def test_guided_backprop_pictures_cover_the_whole_image(tmp_path):
    import inspect_model as im

    model = copy.deepcopy(D.tiny_detector())
    model.transform.max_size = 192
    path, _ = _wide_scene(tmp_path)
    res = im.guided_backprop(model, [str(path)], score_threshold=0.5, max_detections=1,
                             output_dir=str(tmp_path / "g"))
    files = [f for f in (tmp_path / "g").rglob("*.png") if f.name != "overview.png"]
    assert files and res.to_dict()["images"][0]["maps"]
    assert all(Image.open(f).size == (384, 192) for f in files)
