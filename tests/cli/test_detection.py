"""Detection and segmentation models in every gradient command (issue 24).

Tiny torchvision detectors and segmenters are trained in the tests on synthetic shapes
(tests/fixtures/dense.py), so that maps can be checked for falling on the object; the
segmentation target is checked against pytorch-grad-cam's own ``SemanticSegmentationTarget``
+ ``GradCAM`` on the same model, layer and target.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import run_cli
from fixtures import dense as D
from inspect_model.methods.objectives.scores import make_objective
from inspect_model.methods.cam.tasks import compute_task_cams
from inspect_model.methods.objectives.tasks import infer_task, task_auto_layer

FLAGS = ["--resize", "96", "--crop", "96", "--mean", "0", "--std", "1"]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> list[tuple[Path, list[tuple[list[float], int]]]]:
    """Three synthetic pictures at 4x the model's input (so boxes scale by 4) and their objects."""
    root = tmp_path_factory.mktemp("scenes")
    out = []
    for k in range(3):
        img, objects = D.scene(90000 + k)
        p = root / f"scene{k}.png"
        Image.fromarray((img.permute(1, 2, 0).numpy() * 255).astype("uint8")).resize((384, 384), Image.NEAREST).save(p)
        out.append((p, [([v * 4 for v in box], label) for box, label in objects]))
    return out


@pytest.fixture(scope="module")
def dense_py(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("dense") / "dense_models.py"
    p.write_text("from fixtures.dense import tiny_detector, tiny_segmenter\n"
                 "def detector():\n    return tiny_detector()\n"
                 "def segmenter():\n    return tiny_segmenter()\n"
                 "def untrained_detector():\n    return tiny_detector(0)\n")
    return p


def _validate(command: str, doc: dict) -> None:
    import jsonschema

    from inspect_model.schemas import load_schema

    jsonschema.validate(doc, load_schema(command))


def _json(res) -> dict:
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


# ----------------------------------------------------------------------------- the task
def test_task_and_auto_layer_from_the_module():
    import torchvision

    det = torchvision.models.get_model("ssdlite320_mobilenet_v3_large", weights=None, weights_backbone=None)
    seg = torchvision.models.get_model("lraspp_mobilenet_v3_large", weights=None, weights_backbone=None)
    assert infer_task(det) == "detection" and task_auto_layer(det, "detection") == "backbone"
    assert infer_task(seg) == "segmentation" and task_auto_layer(seg, "segmentation") == "backbone.16"
    assert infer_task(D.tiny_detector(0)) == "detection"
    assert task_auto_layer(D.tiny_detector(0), "detection") == "backbone.fpn"
    assert task_auto_layer(D.tiny_segmenter(0), "segmentation") == "backbone.layer2"  # not the classifier
    assert infer_task(torchvision.models.resnet18()) == "classification"


# ----------------------------------------------------------------------------- segmentation
@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_segmentation_map_equals_pytorch_grad_cam():
    """Our SemanticSegmentationTarget Grad-CAM against pytorch-grad-cam's on the same model,
    layer and target: the sum of the class's logits over its predicted mask."""
    gc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    m = D.tiny_segmenter()
    x = torch.stack([D.scene(80000 + s)[0] for s in range(4)])

    class Out(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, t):
            return self.inner(t)["out"]

    wrapped = Out(m).eval()
    with torch.no_grad():
        pred = wrapped(x).argmax(1)
    checked = 0
    for cls in (1, 2):
        res = compute_task_cams(m, x, make_objective("segmentation", m, str(cls), None), "backbone.layer2",
                                ["gradcam"])
        for i in range(x.shape[0]):
            mask = (pred[i] == cls).float().numpy()
            if mask.sum() == 0:
                continue
            with gc.GradCAM(model=wrapped, target_layers=[m.backbone.layer2]) as cam:
                ref = cam(input_tensor=x[i:i + 1], targets=[SemanticSegmentationTarget(cls, mask)])[0]
            ours = [mm for mm in res.maps if mm.row.sample == i][0]
            assert ours.row.mask_source == "predicted" and ours.row.area == int(mask.sum())
            r = np.corrcoef(ref.ravel(), ours.map.numpy().ravel())[0, 1]
            assert r >= 0.99, (cls, i, r)
            checked += 1
    assert checked >= 4


@pytest.mark.slow  # over 3 s (issue 35: the quick tier under 2 minutes); full run only
def test_segmentation_targets_and_absent_class(dense_py, scenes):
    path = scenes[0][0]
    doc = _json(run_cli(["cam", f"{dense_py}:segmenter", str(path), *FLAGS, "--json"]))
    img = doc["images"][0]
    areas = [c["area"] for c in img["legend"]]
    assert areas == sorted(areas, reverse=True) and sum(areas) == 12 * 12 * 64  # 96x96 output pixels
    assert [s["class"] for s in img["segments"]] == [c["class"] for c in img["legend"]]  # predicted: all, by area
    top = _json(run_cli(["cam", f"{dense_py}:segmenter", str(path), *FLAGS, "--target", "top:1", "--json"]))
    assert [s["class"] for s in top["images"][0]["segments"]] == [img["legend"][0]["class"]]
    whole = _json(run_cli(["cam", f"{dense_py}:segmenter", str(path), *FLAGS, "--target", "1@all", "--json"]))
    seg = whole["images"][0]["segments"][0]
    assert seg["mask_source"] == "all" and seg["area"] == 96 * 96
    present = {c["class"] for c in img["legend"]}
    absent = next(c for c in (0, 1, 2) if c not in present) if len(present) < 3 else None
    if absent is not None:
        res = run_cli(["cam", f"{dense_py}:segmenter", str(path), *FLAGS, "--target", str(absent), "--json"])
        assert json.loads(res.stdout)["images"][0]["segments"][0]["mask_source"] == "all (class absent)"
        assert "no pixel in the image is predicted as class" in res.stderr


# ----------------------------------------------------------------------------- detection
@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_detector_maps_fall_on_the_detection():
    """Pointing game on the tiny trained detector: the map's peak lies in the detection's box
    for more than half of the detections, for Grad-CAM, HiResCAM, Layer-CAM and Eigen-CAM."""
    m = D.tiny_detector()
    x = torch.stack([D.scene(70000 + s)[0] for s in range(12)])
    obj = make_objective("detection", m, "predicted", None, score_threshold=0.5, max_detections=3)
    res = compute_task_cams(m, x, obj, "backbone.fpn", ["gradcam", "hirescam", "layercam", "eigencam"])
    assert res.layer["kind"] == "pyramid" and set(res.layer["levels"]) == {"0", "1", "pool"}
    assert len(res.selection.rows) >= 12
    for method in ("gradcam", "hirescam", "layercam", "eigencam"):
        hits = [mm.stats()["peak_in_box"] for mm in res.maps if mm.method == method]
        assert sum(hits) / len(hits) > 0.5, (method, sum(hits), len(hits))
    assert m.roi_heads.score_thresh == 0.05  # the model's own threshold, given back


@pytest.mark.slow  # over 3 s (issue 35: the quick tier under 2 minutes); full run only
def test_cam_on_detector_cli_records_and_pictures(dense_py, scenes, tmp_path):
    out = tmp_path / "o"
    paths = [str(p) for p, _ in scenes]
    res = run_cli(["cam", f"{dense_py}:detector", *paths, *FLAGS, "-m", "gradcam", "-m", "eigencam",
                   "--score-threshold", "0.5", "--max-detections", "2", "--json", "-o", str(out)])
    doc = _json(res)
    assert doc["task"] == "detection" and doc["score_threshold"] == 0.5
    assert doc["options"]["max_detections"] == 2 and doc["layers"][0]["kind"] == "pyramid"
    for img in doc["images"]:
        dets = img["detections"]
        assert 1 <= len(dets) <= 2
        assert [d["confidence"] for d in dets] == sorted((d["confidence"] for d in dets), reverse=True)
        assert all(d["confidence"] >= 0.5 and d["matched_box"] is None and d["score"] == d["confidence"]
                   for d in dets)
        assert len(img["maps"]) == 2 * len(dets)
        for mp in img["maps"]:
            assert mp["detection"]["box"] == dets[mp["rank"]]["box"]
            assert (out / mp["files"]["overlay"]).is_file() and (out / mp["files"]["heatmap"]).is_file()
    assert (out / "contact_sheet_001.png").is_file()
    _validate("cam", doc)


def test_boxes_are_matched_to_the_same_class_detection(dense_py, scenes, tmp_path):
    path, objects = scenes[1]
    box, label = objects[0]
    boxes = tmp_path / "boxes.csv"
    boxes.write_text(f"image,x0,y0,x1,y1,label\n{path.name},{box[0]},{box[1]},{box[2]},{box[3]},{label}\n")
    doc = _json(run_cli(["cam", f"{dense_py}:detector", str(path), *FLAGS, "--score-threshold", "0.3",
                         "--boxes", str(boxes), "--json"]))
    (det,) = doc["images"][0]["detections"]
    assert det["class"] == label
    assert det["matched_box"] == pytest.approx([v / 4 for v in box])  # original pixels -> input pixels
    assert det["iou"] > 0.5
    assert det["score"] == pytest.approx(det["confidence"] + det["iou"], abs=1e-5)  # FasterRCNNBoxScoreTarget


def test_nothing_passes_the_threshold_is_one_warning(dense_py, scenes):
    res = run_cli(["cam", f"{dense_py}:detector", str(scenes[0][0]), *FLAGS, "--score-threshold", "1.0"])
    assert res.exit_code == 0, res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1
    assert "no detection at or above --score-threshold 1" in warnings[0] and "best score" in warnings[0]
    assert "lower --score-threshold" in warnings[0]


def test_guided_backprop_and_grads_take_detections(dense_py, scenes):
    path = str(scenes[2][0])
    doc = _json(run_cli(["guided-backprop", f"{dense_py}:detector", path, *FLAGS, "--score-threshold", "0.5",
                         "--guided-gradcam", "--json"]))
    maps = doc["images"][0]["maps"]
    assert maps and all(m["detection"]["confidence"] >= 0.5 and m["max_abs"] > 0 for m in maps)
    _validate("guided-backprop", doc)
    g = _json(run_cli(["grads", f"{dense_py}:detector", path, *FLAGS, "--score-threshold", "0.5", "--json"]))
    assert "FasterRCNNBoxScoreTarget" in g["objective"]
    assert g["images"][0]["objective"] == pytest.approx(sum(m["target"]["score"] for m in maps), rel=1e-4)


def test_score_threshold_is_restored_and_the_model_untouched():
    m = D.tiny_detector(0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.rand(2, 3, 80, 64)  # not square: the detector resizes and pads, the maps are cropped back
    obj = make_objective("detection", m, "predicted", None, score_threshold=0.0, max_detections=2)
    res = compute_task_cams(m, x, obj, "backbone.fpn", ["gradcam"])
    assert m.roi_heads.score_thresh == 0.05
    assert all(mm.map.shape == (80, 64) for mm in res.maps) and res.maps
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert not any(mod._forward_hooks for mod in m.modules())
    assert all(p.requires_grad and p.grad is None for p in m.parameters())


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_check_reads_detection_outputs(dense_py, scenes):
    res = run_cli(["check", f"{dense_py}:detector", str(scenes[0][0]), *FLAGS])
    assert res.exit_code == 0, res.stderr
    assert "PASS  detection outputs: 0 problems" in res.stdout


def test_bad_class_and_bad_boxes_are_one_line(dense_py, scenes, tmp_path):
    res = run_cli(["cam", f"{dense_py}:untrained_detector", str(scenes[0][0]), *FLAGS, "--target", "7"])
    assert res.exit_code == 4 and res.stderr.count("\n") == 1 and "out of range" in res.stderr
    res = run_cli(["cam", f"{dense_py}:segmenter", str(scenes[0][0]), *FLAGS, "--target", "cat@all"])
    assert res.exit_code == 4 and res.stderr.count("\n") == 1 and "'cat'" in res.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("scene0.png,1,2,three,4\n")
    res = run_cli(["cam", f"{dense_py}:untrained_detector", str(scenes[0][0]), *FLAGS, "--boxes", str(bad)])
    assert res.exit_code == 4 and res.stderr.count("\n") == 1 and "four numbers" in res.stderr


def test_hf_detr_and_segformer(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, num_queries=6, num_labels=3, d_model=32,
        backbone_config=transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 16, 16], depths=[1, 1, 1, 1],
                                                  out_features=["stage4"]),
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32)
    transformers.DetrForObjectDetection(cfg).eval().save_pretrained(tmp_path / "detr")
    scfg = transformers.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                                        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                                        mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3)
    transformers.SegformerForSemanticSegmentation(scfg).eval().save_pretrained(tmp_path / "segformer")
    img = Path(__file__).resolve().parents[2] / "sample_images" / "cat.jpg"
    small = ["--resize", "64", "--crop", "64"]
    doc = _json(run_cli(["cam", str(tmp_path / "detr"), str(img), *small, "--score-threshold", "0",
                         "--max-detections", "2", "-m", "gradcam", "-m", "eigencam", "--json"]))
    assert doc["task"] == "detection" and doc["layers"][0]["name"] == "model.input_projection"
    assert len(doc["images"][0]["detections"]) == 2
    doc = _json(run_cli(["cam", str(tmp_path / "segformer"), str(img), *small, "--json"]))
    assert doc["task"] == "segmentation" and doc["layers"][0]["name"].endswith("layer_norm")
    res = run_cli(["summary", str(tmp_path / "detr"), "--input-size", "3x64x64"])
    assert res.exit_code == 0, res.stderr
    assert "used a real forward pass on cpu" in res.stdout + res.stderr


def test_finish_crops_the_padded_part():
    """A detector pads its resized batch; the map of a sample covers its own part only."""
    from inspect_model.methods.cam.tasks import finish

    raw = torch.zeros(4, 8)
    raw[:, :4] = torch.arange(4.0)  # the image: evidence rising to the right
    raw[:, 4:] = 10.0  # the padding: larger still, and never part of the picture
    out = finish(raw, (1.0, 0.5), (40, 40))
    assert out.shape == (40, 40)
    assert math.isclose(float(out[:, -1].min()), 1.0, abs_tol=1e-6) and float(out[:, 0].max()) < 0.05


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_evaluate_scores_the_same_target(dense_py, scenes):
    """Deletion starts from the unperturbed input: its first point is the class's mean
    probability over the explained mask, computed here independently."""
    path = scenes[0][0]
    doc = _json(run_cli(["cam", f"{dense_py}:segmenter", str(path), *FLAGS, "--target", "1", "--evaluate",
                         "--eval-steps", "4", "--metric", "deletion", "--metric", "insertion", "--json"]))
    rec = doc["images"][0]["maps"][0]
    curve = rec["evaluation"]["curves"]["deletion"]
    assert len(curve) == 5 and curve[0] >= curve[-1]
    x = torch.from_numpy(np.array(Image.open(path).convert("RGB").resize((96, 96), Image.BILINEAR))).permute(2, 0, 1)
    x = x.float().div(255)[None]
    m = D.tiny_segmenter()
    with torch.no_grad():
        probs = m(x)["out"].softmax(1)[0]
    cls = rec["segmentation"]["class"]
    mask = probs.argmax(0) == cls
    assert curve[0] == pytest.approx(float(probs[cls][mask].mean()), abs=2e-3)
    det = _json(run_cli(["cam", f"{dense_py}:detector", str(scenes[2][0]), *FLAGS, "--score-threshold", "0.5",
                         "--evaluate", "--eval-steps", "4", "--metric", "deletion", "--json"]))
    for mp in det["images"][0]["maps"]:
        curve = mp["evaluation"]["curves"]["deletion"]
        assert curve[0] == pytest.approx(mp["detection"]["confidence"], abs=2e-3) and curve[-1] < 0.5


def test_images_of_different_sizes_and_classifier_options_refused(dense_py):
    root = Path(__file__).resolve().parents[2] / "sample_images"
    doc = _json(run_cli(["cam", f"{dense_py}:untrained_detector", str(root / "cat.jpg"), str(root / "astronaut.jpg"),
                         "--resize", "80", "--crop", "64", "--mean", "0", "--std", "1", "--score-threshold", "0",
                         "--max-detections", "1", "-m", "eigencam", "--json"]))
    assert [len(img["detections"]) for img in doc["images"]] == [1, 1]
    assert doc["images"][0]["size"] != doc["images"][1]["size"]
    res = run_cli(["grads", f"{dense_py}:untrained_detector", str(root / "cat.jpg"), "--loss", "cross-entropy",
                   "--label", "1"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "--loss" in res.stderr
    res = run_cli(["cam", f"{dense_py}:untrained_detector", str(root / "cat.jpg"), "-m", "scorecam"])
    assert res.exit_code == 2 and "does not apply to a detection model" in res.stderr
