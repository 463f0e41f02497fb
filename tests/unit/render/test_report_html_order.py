"""report.html's pictures per image (issue 39, item 11): in the report's order of maps, not by
file name (`gradcam++` sorted before `gradcam`), and each map's overlay and heat map side by
side in one row; summary --graph's graph.svg shown once."""

from __future__ import annotations

import re

from inspect_model.render.html import render_html


def _doc() -> dict:
    maps = []
    for method in ("gradcam", "gradcam++"):
        stem = f"images/0000-cat/{method}.layer4.c1"
        # report.json sorts keys: "heatmap" comes before "overlay" there
        maps.append({"method": method, "layer": "layer4", "target": {"class": 1},
                     "files": {"heatmap": f"{stem}.heatmap.png", "overlay": f"{stem}.overlay.png"}})
    files = sorted(f for m in maps for f in m["files"].values())
    return {"command": "cam", "images": [{"image": "cat.jpg", "maps": maps}], "files": files}


def test_pictures_follow_the_maps_and_pair_overlay_with_heatmap() -> None:
    html = render_html(_doc())
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert srcs == ["images/0000-cat/gradcam.layer4.c1.overlay.png", "images/0000-cat/gradcam.layer4.c1.heatmap.png",
                    "images/0000-cat/gradcam++.layer4.c1.overlay.png",
                    "images/0000-cat/gradcam++.layer4.c1.heatmap.png"]
    pairs = re.findall(r'<div class="pair">(.*?)</div>', html)
    assert len(pairs) == 2 and all(p.count("<figure>") == 2 for p in pairs)
    assert ".pair{display:flex;flex-wrap:nowrap" in html  # side by side, never wrapped apart


def test_summary_graph_svg_is_shown_once() -> None:
    html = render_html({"command": "summary", "files": ["graph.dot", "graph.png", "graph.svg", "report.json"]})
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert srcs == ["graph.svg"] and "graph.svg: the model" in html
