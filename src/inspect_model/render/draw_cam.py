"""The files of ``cam``: per image (``images/NNNN-stem/``)
``<method>.<layer>.<class>.overlay.png`` (the map on the original image), ``.heatmap.png``
(the bare map with a colour bar), or for a clip's (T, H, W) map ``.strip.png`` and
``.overlay.gif`` (:mod:`inspect_model.render.video`), with ``save_raw`` ``.input.npy`` / ``.layer.npy``, with
evaluation ``evaluation_curves.png``; contact sheets (rows: image x target, columns: method x
layer) at the top as ``contact_sheet_NNN.png``, in pages (:mod:`inspect_model.render.sheet_pages`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_model.output.files import class_tag, image_dir, safe_name
from inspect_model.render.sheet_pages import SheetDrawer
from inspect_model.output.sink import Sink
from inspect_model.render.labels import target_label


class CamDrawer(SheetDrawer):
    """Draws what :class:`inspect_model.api.cam.CamSession` records. ``columns`` (method,
    layer) is set by the session once the layers are resolved."""

    photo = True

    def __init__(self, *, categories: list[str] | None, preprocess: Any, alpha: float, colormap: str,
                 save_raw: bool, curves: bool, task: str = "classification") -> None:
        self.categories, self.preprocess, self.task = categories, preprocess, task
        self.alpha, self.colormap, self.save_raw, self.curves = alpha, colormap, save_raw, curves
        self.columns: list[tuple[str, str]] = []
        super().__init__()

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import overlay as ov

        if item.data is None:
            return item.entry.get("files", {})
        if self.task != "classification":  # boxes, mask outlines, legend (issue 24)
            from inspect_model.render.draw_dense import draw_dense

            return draw_dense(self, item, sink)
        img, x, maps, probs = item.data
        entry = item.entry
        cats = self.categories
        pre = self.preprocess
        if img is not None:
            # Reduced here, once per image: the queued jobs hold at most OVERLAY_SIDE pixels a side.
            picture, box = ov.viewable(img.image, pre.uncrop_box(*img.image.size) if pre is not None else None)
        else:
            picture = ov.input_picture(x.detach().float().cpu()) if x.dim() == 3 else None  # a clip: its frames
            box = None
        base = image_dir(entry["index"], entry["image"])
        rows: dict[int, dict[tuple[str, str], Any]] = {}
        for m, rec in zip(maps, entry["maps"]):
            cls = m.target
            arr = m.map.numpy()
            title = f"{target_label(rec['target'])} p={float(probs[cls]):.3f}"
            zero = ov.zero_line(m.warnings)
            names: dict[str, Any] = {}
            if sink.out is not None:
                stem = f"{base}/{safe_name(m.method)}.{safe_name(m.layer)}.{class_tag(cls, cats)}"
                kinds = {"strip": "strip.png", "animation": "overlay.gif"} if arr.ndim == 3 else \
                    {"overlay": "overlay.png", "heatmap": "heatmap.png"}  # a clip's map: frames (render/video.py)
                names = {k: sink.out.reserve(f"{stem}.{ext}") for k, ext in kinds.items()}
                rec["files"] = {k: sink.relative(final) for k, (_, final) in names.items()}
                if self.save_raw:
                    rec["files"]["raw_input"] = sink.npy(f"{stem}.input.npy", arr)
                    if m.raw is not None:
                        rec["files"]["raw_layer"] = sink.npy(f"{stem}.layer.npy", m.raw.numpy())
            # Drawing and encoding run on the sink's workers while the model computes on.
            if arr.ndim == 3:
                from inspect_model.render.video import clip_map_job

                job = clip_map_job(sink, names, img, x, arr, box, alpha=self.alpha, cmap=self.colormap,
                                   title=f"{m.method} @ {m.layer}: {title}")
            else:
                job = _map_job(sink, names, picture, arr, box, self.alpha, self.colormap,
                               f"{m.method} @ {m.layer}\n{title}" + (f"\n{zero}" if zero else ""),
                               keep=sink.writer is not None)
            fut = sink.defer(job)
            if sink.writer is not None and arr.ndim == 2:
                import numpy as np

                sink.writer.add_image(f"cam/{m.method}/{m.layer}/rank{m.rank}", np.asarray(fut.result()[1]),
                                      entry["index"], dataformats="HWC")
            rows.setdefault(m.rank, {})[(m.method, m.layer)] = (fut, title + (" · numerically zero" if zero else ""))
        if sink.out is not None:
            for rank in sorted(rows):
                cells = [rows[rank].get(col) for col in self.columns]
                self.sheet_rows.append((f"{Path(entry['image']).name} #{rank + 1}", cells))
            self._flush_sheet(sink, final=False)
        if sink.out is not None and self.curves:
            from inspect_model.render import faithfulness as rf

            series = rf.image_series(entry)
            if series:
                title = f"[{entry['index']}] {Path(entry['image']).name}: deletion and insertion curves"
                name = sink.figure(rf.curve_plot_name(entry), rf.curves_figure(series, title))
                return {"evaluation_curves": name} if name else {}
        return {}

    def _sheet_wanted(self) -> bool:
        """A sheet when there are several images or several columns."""
        return bool(len(self.columns) > 1 or len(self.sheet_rows) > 1 or self.sheets)

    def _page(self, rows: list[Any], page: int) -> Any:
        from inspect_model.render.overlay import SheetCell, contact_sheet

        cols = [f"{m} @ {lay}" for m, lay in self.columns]

        def draw() -> Any:
            # The cells are thumbnails that jobs queued before this one draw: a worker
            # waits for them (the queue is first in, first out, so they have started),
            # and the model computes on meanwhile.
            cells = [(label, [None if c is None else SheetCell(_thumb(c[0]), c[1]) for c in row])
                     for label, row in rows]
            return contact_sheet(cells, cols, title=f"class activation maps (page {page})")

        return draw

    def _stored_rows(self, rows: list[Any]) -> list[Any]:
        """Thumbnails drawn by the workers: their images, not futures."""
        return [(label, [None if c is None else (_thumb(c[0]), c[1]) for c in row]) for label, row in rows]


def _map_job(sink: Sink, names: dict[str, Any], picture: Any, arr: Any, box: Any, alpha: float, cmap: str,
             title: str, *, keep: bool) -> Any:
    """The work of one map, for a worker: the overlay and the heat map, drawn and written;
    gives (contact-sheet thumbnail, the overlay when ``keep``)."""
    from inspect_model.render import overlay as ov
    from inspect_model.output.files import png_bytes

    def job() -> tuple[Any, Any]:
        over = ov.overlay(picture, arr, box, alpha=alpha, cmap=cmap)
        if names and sink.out is not None:
            sink.out.write_staged(*names["overlay"], png_bytes(over, photo=True))
            sink.out.write_staged(*names["heatmap"], png_bytes(ov.heatmap_image(arr, title, cmap=cmap)))
        return ov.thumbnail(over), over if keep else None

    return job


def _thumb(cell: Any) -> Any:
    """A contact-sheet thumbnail: a worker's future (its result's first item) or, after a
    resume, the image itself."""
    return cell.result()[0] if hasattr(cell, "result") else cell
