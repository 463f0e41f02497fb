"""Issue 35: renderers format typed records. ``Record.from_dict`` reads a report (a ``--json``
document, or a resumed run's stored entries) back into its records; writing them again gives
the same document, and the cam text report is rendered from them."""

from __future__ import annotations

import json

import torch

import inspect_model as im
from fixtures.models import TinyCNN
from inspect_model.reports.base import ABSENT


def _plain(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_cam_attributions_guided_reports_round_trip_through_their_records() -> None:
    from inspect_model.reports.attributions import AttributionsReport
    from inspect_model.reports.cam import CamMap, CamReport, ClassScore
    from inspect_model.reports.guided_backprop import GuidedBackpropReport

    torch.manual_seed(0)
    net, x = TinyCNN().eval(), torch.randn(2, 3, 8, 8)
    runs = ((CamReport, im.cam(net, x, methods=["gradcam", "eigencam"], layers=["features.3"])),
            (AttributionsReport, im.attributions(net, x, methods=["saliency", "integrated-gradients"], steps=4)),
            (GuidedBackpropReport, im.guided_backprop(net, x, target="top:2")))
    for cls, res in runs:
        doc = _plain(res.to_dict())
        rec = cls.from_dict(doc)
        again = _plain(rec.to_dict())
        assert again == {k: v for k, v in doc.items() if k in again}, cls.__name__
    cam = CamReport.from_dict(_plain(runs[0][1].to_dict()))
    first = cam.images[0].maps[0]
    assert isinstance(first, CamMap) and isinstance(first.target, ClassScore)  # nested records, typed
    assert first.clip is ABSENT and first.target.objective is ABSENT  # optional keys left out stay out


def test_the_cam_text_report_is_the_same_from_the_payload_and_from_the_records() -> None:
    from inspect_model.render import cam_report
    from inspect_model.reports.cam import CamReport

    torch.manual_seed(0)
    res = im.cam(TinyCNN().eval(), torch.randn(1, 3, 8, 8), methods=["gradcam"], layers=["features.3"])
    doc = _plain(res.to_dict())
    text = cam_report.render_text(doc)
    assert text == cam_report.render_text(CamReport.from_dict(doc))
    assert "gradcam" in text and "features.3" in text


def test_the_attention_report_round_trips_and_renders_from_its_records() -> None:
    from pathlib import Path

    from inspect_model.render.attention import report_text
    from inspect_model.reports.attention import AttentionImageMap, AttentionReport

    root = Path(__file__).resolve().parents[3]
    import importlib.util

    spec = importlib.util.spec_from_file_location("attn_models", root / "tests" / "fixtures" / "attention_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    torch.manual_seed(0)
    res = im.attention(mod.tiny_vit(), torch.randn(1, 3, 32, 32), methods=["raw", "rollout", "grad-rollout"])
    doc = _plain(res.to_dict())
    rep = AttentionReport.from_dict(doc)
    assert isinstance(rep.images[0].maps[0], AttentionImageMap)
    again = _plain(rep.to_dict())
    assert again == {k: v for k, v in doc.items() if k in again}
    text = report_text(doc)
    assert text == report_text(rep) and "rollout" in text and "peak at patch" in text
