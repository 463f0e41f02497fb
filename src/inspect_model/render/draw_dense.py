"""The files of ``cam`` on a detector or a segmenter (issue 24), for
:class:`~inspect_model.render.draw_cam.CamDrawer`: per image and map an overlay with the
explained box (class and score) or the mask's outline, the heat map, a segmentation's
``legend.png`` (classes and areas), and one contact-sheet row per detection or class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_model.output.files import class_tag, image_dir, safe_name
from inspect_model.output.sink import Sink


def describe_row(row: Any, task: str) -> str:
    """What a map explains, in words: a detection (rank, class, score) or a class."""
    tag = f"class {row.label}{' ' + row.name if row.name else ''}"
    return f"detection #{row.rank + 1} ({tag}, score {row.confidence:.3f})" if task == "detection" else tag


def draw_dense(drawer: Any, item: Any, sink: Sink) -> dict[str, Any]:
    """Draw one image's maps of a detection or segmentation run (``drawer``: a CamDrawer)."""
    from inspect_model.render import overlay as ov

    img, x, maps, extra = item.data
    entry, task = item.entry, drawer.task
    pre = drawer.preprocess
    if img is not None:
        picture, crop = ov.viewable(img.image, pre.uncrop_box(*img.image.size) if pre is not None else None)
    else:
        picture, crop = ov.input_picture(x.detach().float().cpu()), None
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    base = image_dir(entry["index"], entry["image"])
    files: dict[str, Any] = {}
    if extra["class_map"] is not None and sink.out is not None and entry.get("legend"):
        from inspect_model.render.dense import legend

        cm, legend_rows = extra["class_map"].numpy(), entry["legend"]
        files["legend"] = sink.image(f"{base}/legend.png", lambda: legend(
            picture, cm, legend_rows, crop=crop, title=f"[{entry['index']}] {Path(entry['image']).name}"),
            photo=True)
    others = [(m.row.box, "") for m in maps if m.row.box is not None and m.row.confidence is not None]
    rows: dict[int, dict[tuple[str, str], Any]] = {}
    for m, rec in zip(maps, entry["maps"]):
        row = m.row
        caption = f"{row.label}{' ' + row.name if row.name else ''}"
        caption += (f" {row.confidence:.2f}" if row.confidence is not None
                    else f" {100 * (row.area_fraction or 0):.1f}%")
        tag = class_tag(row.label, drawer.categories)
        whole = ".all" if row.mask_source in ("all", "box") else ""
        stem = f"{base}/{safe_name(m.method)}.{safe_name(m.layer)}." + (
            f"d{row.rank + 1}-{tag}" if task == "detection" else tag + whole)
        names: dict[str, Any] = {}
        if sink.out is not None:
            names = {"overlay": sink.out.reserve(f"{stem}.overlay.png"),
                     "heatmap": sink.out.reserve(f"{stem}.heatmap.png")}
            rec["files"] = {k: sink.relative(final) for k, (_, final) in names.items()}
            if drawer.save_raw:
                rec["files"]["raw_input"] = sink.npy(f"{stem}.input.npy", m.map.numpy())
                rec["files"]["raw_layer"] = sink.npy(f"{stem}.layer.npy", m.raw.numpy())
        title = f"{m.method} @ {m.layer}\n{describe_row(row, task)}"
        from inspect_model.render.overlay import zero_line

        if zero_line(m.warnings):  # float noise: said in the picture, the overlay's caption and the sheet
            title += "\n" + zero_line(m.warnings)
            caption += " · numerically zero"
        fut = sink.defer(_job(sink, names, picture, m.map.numpy(), crop, hw, drawer.alpha, drawer.colormap,
                              title, caption, row, others))
        rows.setdefault(row.rank, {})[(m.method, m.layer)] = (fut, caption)
    if sink.out is not None:
        for rank in sorted(rows):
            cells = [rows[rank].get(col) for col in drawer.columns]
            drawer.sheet_rows.append((f"{Path(entry['image']).name} #{rank + 1}", cells))
        drawer._flush_sheet(sink, final=False)
    return files


def _job(sink: Sink, names: dict[str, Any], picture: Any, arr: Any, crop: Any, hw: tuple[int, int], alpha: float,
         cmap: str, title: str, caption: str, row: Any, others: list[Any]) -> Any:
    """The work of one map, for a worker: the annotated overlay and the heat map."""
    from inspect_model.render import overlay as ov
    from inspect_model.render.dense import annotate
    from inspect_model.output.files import png_bytes

    def job() -> tuple[Any, Any]:
        over = ov.overlay(picture, arr, crop, alpha=alpha, cmap=cmap)
        over = annotate(over, crop=crop, input_hw=hw, box=row.box if row.confidence is not None else None,
                        caption=caption, others=[o for o in others if o[0] != row.box], named=row.matched_box,
                        mask=None if row.mask is None else row.mask.numpy())
        if names and sink.out is not None:
            sink.out.write_staged(*names["overlay"], png_bytes(over, photo=True))
            sink.out.write_staged(*names["heatmap"], png_bytes(ov.heatmap_image(arr, title, cmap=cmap)))
        return ov.thumbnail(over), None

    return job
