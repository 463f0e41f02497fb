"""The files of ``attributions``: per image (``images/NNNN-stem/``)
``<method>.<class>.heatmap.png`` (the map with a colour bar in its own units; signed maps on a
diverging colormap centred on 0), ``<method>.<class>.overlay.png`` (on the original picture),
with ``save_raw`` ``<method>.<class>.npy``, with evaluation ``evaluation_curves.png``; contact
sheets (rows: image x target, columns: input and methods) at the top as
``contact_sheet_NNN.png``, in pages (:mod:`inspect_model.render.sheet_pages`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_model.render import attributions as ra
from inspect_model.output.files import class_tag, image_dir
from inspect_model.render.sheet_pages import SheetDrawer
from inspect_model.output.sink import Sink
from inspect_model.render.labels import target_label


class AttributionsDrawer(SheetDrawer):
    """Draws what :class:`inspect_model.api.attributions.AttributionsSession` records; an
    item's data is (loaded image or None, model input (C, ...), {method: (K, *sample)})."""

    def __init__(self, *, categories: list[str] | None, preprocess: Any, methods: list[str], save_raw: bool,
                 overlays: bool, curves: bool) -> None:
        self.categories, self.preprocess, self.methods = categories, preprocess, methods
        self.save_raw, self.overlays, self.curves = save_raw, overlays, curves
        super().__init__()  # sheet_rows: (label, input thumbnail, [(map thumbnail, caption)])

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import overlay as ov

        if item.data is None:
            return item.entry.get("files", {})
        if sink.out is None:
            return {}
        img, x, maps = item.data
        entry, pre = item.entry, self.preprocess
        picture, box = None, None
        if img is not None:
            picture, box = ov.viewable(img.image, pre.uncrop_box(*img.image.size) if pre is not None else None)
        elif x.dim() == 3:
            picture = ov.input_picture(x)
        seen = None
        if x.dim() == 3:
            seen = ra.sheet_picture(ov.input_picture(x, getattr(pre, "mean", None), getattr(pre, "std", None)))
        elif (entry.get("text") or {}).get("tokens"):  # a text: its tokens, under the maps' cells
            seen = ra.sheet_tokens(entry["text"]["tokens"])
        base = image_dir(entry["index"], entry["image"])
        rows: dict[int, list[Any]] = {}
        for rec in entry["maps"]:
            k, method, signed = rec["rank"], rec["method"], rec["signed"]
            m = maps[method][k]
            stem = f"{base}/{method}.{class_tag(rec['target']['class'], self.categories)}"
            title = f"{method}{' (smoothed)' if rec['smoothed'] else ''}\n{Path(entry['image']).name}: " \
                    f"{_label(rec['target'])}, score {rec['target']['score']:.4g}"
            tokens = (entry.get("text") or {}).get("tokens")  # a token map: its tokens under the cells
            files = {"heatmap": sink.image(f"{stem}.heatmap.png", lambda m=m, t=title, s=signed: ra.heatmap(
                m, t, signed=s, tokens=tokens))}
            if self.overlays and picture is not None and m.dim() == 3:
                files["overlay"] = sink.image(f"{stem}.overlay.png", lambda m=m, s=signed: ra.overlay(
                    picture, m, box, signed=s), photo=True)
            if self.save_raw:
                files["raw"] = sink.npy(f"{stem}.npy", m.numpy())
            rec["files"] = {key: v for key, v in files.items() if v is not None}
            rows.setdefault(k, []).append((ra.sheet_cell(m, signed), ra.caption(rec)))
        for k in sorted(rows):
            target = next(r["target"] for r in entry["maps"] if r["rank"] == k)
            self.sheet_rows.append((f"{Path(entry['image']).name}: {_label(target)}", seen, rows[k]))
        self._flush_sheet(sink, final=False)
        return self._curves(entry, sink)

    def _curves(self, entry: dict[str, Any], sink: Sink) -> dict[str, Any]:
        if not self.curves:
            return {}
        from inspect_model.render import faithfulness as rf

        series = rf.image_series(entry)
        if not series:
            return {}
        title = f"[{entry['index']}] {Path(entry['image']).name}: deletion and insertion curves"
        name = sink.figure(f"{image_dir(entry['index'], entry['image'])}/evaluation_curves.png",
                           rf.curves_figure(series, title))
        return {"evaluation_curves": name} if name else {}

    def _page(self, rows: list[Any], page: int) -> Any:
        methods = list(self.methods)
        return lambda: ra.sheet(rows, methods, title=f"attributions (page {page})")


def _label(target: dict[str, Any]) -> str:
    return target_label(target)
