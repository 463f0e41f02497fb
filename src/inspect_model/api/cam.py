"""``cam``: class activation maps per image, target, method and layer, as a session.

Files per image (``images/NNNN-stem/``): ``<method>.<layer>.<class>.overlay.png`` (the map
on the original image), ``.heatmap.png`` (the bare map with a colour bar) and, with
``save_raw``, ``.input.npy`` / ``.layer.npy``; contact sheets (rows: image x target,
columns: method x layer) at the top as ``contact_sheet_NNN.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import (
    ImageItem,
    Result,
    Session,
    Sink,
    Warnings,
    class_tag,
    execute,
    image_dir,
    input_outcome,
    prepare,
    tracked,
)
from inspect_model.errors import InputError, UsageError

SHEET_ROWS = 16  # rows per contact-sheet page: memory stays bounded for any number of images


def check_cam_request(*, methods: list[str] | None, layers: list[str] | None, reshape: str | None, fuse: bool,
                      scorecam_batch: int, colormap: str, alpha: float, top: int) -> tuple[list[str], Any]:
    """The cam options that need no model, checked before anything loads."""
    from inspect_model.methods.cam import parse_methods, parse_reshape

    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"--alpha must be between 0 and 1, got {alpha}")
    if scorecam_batch < 1:
        raise UsageError(f"--scorecam-batch must be 1 or more, got {scorecam_batch}")
    if top < 1:
        raise UsageError(f"--top must be 1 or more, got {top}")
    parsed = parse_methods(methods)
    grid = parse_reshape(reshape)
    if fuse and len(layers or []) < 2:
        raise UsageError("--fuse combines several layers; give --layer at least twice")
    from inspect_model.render.overlay import check_colormap

    check_colormap(colormap)
    return parsed, grid


class CamSession(Session):
    """Feed batches; each image gives its predictions and maps (see the module docstring)."""

    command = "cam"
    streams_files = True
    page_base = 0  # first contact-sheet page number - 1 (another rank's pages come first)

    def __init__(self, prep: Any, mopts: ModelOptions, *, methods: list[str] | None = None,
                 layers: list[str] | None = None, reshape: str | None = None, fuse: bool = False,
                 target: str = "predicted", output_key: str | None = None, scorecam_batch: int = 32,
                 colormap: str = "jet", alpha: float = 0.5, top: int = 5, save_raw: bool = False,
                 notes: Any = None, evaluate: bool = False, metrics: list[str] | None = None, boxes: Any = None,
                 eval_steps: int = 32, eval_batch: int = 64, progress: Any = None,
                 score_threshold: float | None = None, max_detections: int = 10) -> None:
        from inspect_model.api.cam_tasks import DenseCam, dense_task
        from inspect_model.methods.targets import parse_target

        self.method_items = list(methods or ["gradcam"])  # as typed: `all` makes CAM optional
        self.methods, self.reshape = check_cam_request(
            methods=self.method_items, layers=layers, reshape=reshape, fuse=fuse, scorecam_batch=scorecam_batch,
            colormap=colormap, alpha=alpha, top=top)
        self.prep, self.mopts, self.layer_specs = prep, mopts, list(layers or [])
        self.fuse, self.output_key, self.scorecam_batch = fuse, output_key, scorecam_batch
        self.colormap, self.alpha, self.top, self.save_raw = colormap, alpha, top, save_raw
        self.target_text = target
        self.notes = notes or (lambda text: None)
        self.progress = progress  # progress(done, total, label) for the long inner loops
        self.warnings = Warnings()
        task = dense_task(prep)  # detection / segmentation: maps of detections and masks (issue 24)
        self.dense = None if task == "classification" else DenseCam(
            self, task, target=target, score_threshold=score_threshold, max_detections=max_detections, boxes=boxes)
        self.spec = parse_target(target, prep.categories) if self.dense is None else self.dense.objective.spec
        self.cam_layers: list[Any] | None = None
        self.entries: list[dict[str, Any]] = []
        self.passes = {"forward": 0, "backward": 0, "scorecam_forward": 0}
        self.columns: list[tuple[str, str]] = []
        self.eval_options = {"evaluate": evaluate, "metrics": None, "boxes": str(boxes) if boxes else None,
                             "eval_steps": eval_steps, "eval_batch": eval_batch}
        self.evaluator: Any = None
        if boxes and not evaluate and self.dense is None:
            raise UsageError("--boxes needs --evaluate (for a classifier; a detector or a segmenter takes --boxes "
                             "as the boxes to explain)")
        if evaluate or metrics or (boxes and self.dense is None):
            from inspect_model.api.cam_evaluate import Evaluator, check_evaluate_request

            parsed = check_evaluate_request(evaluate=evaluate, metrics=metrics, boxes=boxes, steps=eval_steps,
                                            batch=eval_batch)
            self.eval_options["metrics"] = parsed
            self.evaluator = Evaluator(prep, parsed, steps=eval_steps, batch=eval_batch, boxes=boxes,
                                       output_key=output_key, notes=self.notes, progress=progress)
        self.reset_drawing()

    # ------------------------------------------------------------------ computing
    def _resolve(self, x: Any) -> None:
        from inspect_model.methods.cam import resolve_layers

        net = self.prep.loaded.model
        self.cam_layers = resolve_layers(net, x, self.layer_specs or None, self.reshape, self.output_key,
                                         probe=getattr(self.prep.loaded, "static_batch", None) or 1)
        for lay in self.cam_layers:
            g = lay.layout.grid
            self.notes(f"layer: {lay.name} ({lay.layout.kind}, {g[0]}x{g[1]} grid, {lay.layout.channels} channels)")
        if "scorecam" in self.methods:
            plan = self.prep.plan
            n_images = len(plan.paths) if plan.paths else int(x.shape[0])
            per = sum(lay.layout.channels for lay in self.cam_layers)
            runs = sum(-(-lay.layout.channels // self.scorecam_batch) for lay in self.cam_layers) * n_images
            self.notes(f"scorecam: {per} masked inputs per image ({n_images} image(s): {per * n_images} in all), "
                       f"run as {runs} forward passes of up to {self.scorecam_batch} (--scorecam-batch)")
        names = [lay.name for lay in self.cam_layers]
        if self.fuse and len(names) > 1:
            names.append("fused:" + "+".join(names))
        self.columns = [(m, n) for n in names for m in self.methods]

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.cam import compute_cams

        if self.dense is not None:
            return self.dense.feed(batch)
        if self.cam_layers is None:
            self._resolve(batch.tensor)
        res = compute_cams(self.prep.loaded.model, batch.tensor, layers=self.cam_layers, methods=self.method_items,
                           target=self.spec, output_key=self.output_key, scorecam_batch=self.scorecam_batch,
                           fuse=self.fuse, progress=self.progress)
        for key in self.passes:
            self.passes[key] += res.passes[key]
        self.warnings.extend(res.notes)
        items = []
        first = len(self.entries)
        for i in range(batch.tensor.shape[0]):
            index = self.index_base + len(self.entries)
            name = batch.names[i]
            img = batch.images[i] if batch.images is not None else None
            entry = self._entry(res, i, index, name, img)
            self.entries.append(entry)
            maps = [m for m in res.maps if m.sample == i]
            items.append(ImageItem(entry, (img, batch.tensor[i], maps, res.probabilities[i])))
        if self.evaluator is not None:
            self.evaluator.feed(res, batch, self.entries[first:])
        return items

    def _entry(self, res: Any, i: int, index: int, name: str, img: Any) -> dict[str, Any]:
        from inspect_model.render.cam_report import image_record

        for m in res.maps:
            if m.sample == i:
                for w in m.warnings:
                    self.warnings.add(f"{name}: {m.method} at {m.layer} for class {m.target}: {w}")
        size = list(img.image.size) if img is not None else None
        return image_record(res, i, index=index, name=name, size=size, categories=self.prep.categories,
                            top=self.top)

    def finish(self) -> Result:
        from inspect_model.render import cam_report as render

        plan = self.prep.plan
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        skipped = input_outcome(plan, self.warnings)
        layers = self.cam_layers or []
        payload = {
            "model": self.prep.loaded.name,
            "methods": list(self.methods),
            "layers": [lay.describe() for lay in layers],
            "target": self.spec.text,
            "fuse": bool(self.fuse and len(layers) > 1),
            "images": self.entries,
            "image_count": len(self.entries),
            "passes": dict(self.passes),
            "skipped": skipped,
        }
        if self.evaluator is not None:
            payload["evaluation"] = self.evaluator.summary(self.entries, self.columns)
        options = self.prep.options(
            self.mopts, layers=[lay.name for lay in layers], layer_specs=self.layer_specs or ["auto"],
            reshape=list(self.reshape) if self.reshape else None, target=self.target_text,
            methods=list(self.methods), fuse=self.fuse, output_key=self.output_key,
            scorecam_batch=self.scorecam_batch, colormap=self.colormap, alpha=self.alpha, top=self.top,
            save_raw=self.save_raw, **self.eval_options)
        if self.dense is not None:
            self.dense.finish(payload, options)
        return Result("cam", options, payload, self.warnings.to_list(), record=None,
                      render_text=lambda r: render.render_text(r.to_dict()),
                      render_rich=lambda r: render.render_rich(r.to_dict()))

    # ------------------------------------------------------------------ drawing
    def reset_drawing(self) -> None:
        self.sheet_rows: list[Any] = []
        self.sheets: list[str] = []

    def draw(self, item: ImageItem, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import overlay as ov

        if item.data is None:
            return item.entry.get("files", {})
        if self.dense is not None:
            return self.dense.draw(item, sink)
        img, x, maps, probs = item.data
        entry = item.entry
        cats = self.prep.categories
        pre = self.prep.plan.preprocess
        if img is not None:
            # Reduced here, once per image: the queued jobs hold at most OVERLAY_SIDE pixels a side.
            picture, box = ov.viewable(img.image, pre.uncrop_box(*img.image.size) if pre is not None else None)
        else:
            picture = ov.input_picture(x.detach().float().cpu())
            box = None
        base = image_dir(entry["index"], entry["image"])
        rows: dict[int, dict[tuple[str, str], Any]] = {}
        for m, rec in zip(maps, entry["maps"]):
            cls = m.target
            cname = cats[cls] if cats and 0 <= cls < len(cats) else None
            arr = m.map.numpy()
            title = f"{cls}{' ' + cname if cname else ''} p={float(probs[cls]):.3f}"
            names: dict[str, Any] = {}
            if sink.out is not None:
                from inspect_model.render.files import safe_name

                stem = f"{base}/{safe_name(m.method)}.{safe_name(m.layer)}.{class_tag(cls, cats)}"
                names = {"overlay": sink.out.reserve(f"{stem}.overlay.png"),
                         "heatmap": sink.out.reserve(f"{stem}.heatmap.png")}
                rec["files"] = {k: sink._rel(str(final)) for k, (_, final) in names.items()}
                if self.save_raw:
                    rec["files"]["raw_input"] = sink.npy(f"{stem}.input.npy", arr)
                    if m.raw is not None:
                        rec["files"]["raw_layer"] = sink.npy(f"{stem}.layer.npy", m.raw.numpy())
            # Drawing and encoding run on the sink's workers while the model computes on.
            job = _draw_map_job(sink, names, picture, arr, box, self.alpha, self.colormap,
                                f"{m.method} @ {m.layer}\n{title}", keep=sink.writer is not None)
            fut = sink.defer(job)
            if sink.writer is not None:
                import numpy as np

                sink.writer.add_image(f"cam/{m.method}/{m.layer}/rank{m.rank}", np.asarray(fut.result()[1]),
                                      entry["index"], dataformats="HWC")
            rows.setdefault(m.rank, {})[(m.method, m.layer)] = (fut, title)
        if sink.out is not None:
            for rank in sorted(rows):
                cells = [rows[rank].get(col) for col in self.columns]
                self.sheet_rows.append((f"{Path(entry['image']).name} #{rank + 1}", cells))
            self._flush_sheet(sink, final=False)
        if sink.out is not None and self.evaluator is not None:
            from inspect_model.api.cam_evaluate import curve_plot_name
            from inspect_model.render import faithfulness as rf

            series = rf.image_series(entry)
            if series:
                title = f"[{entry['index']}] {Path(entry['image']).name}: deletion and insertion curves"
                name = sink.figure(curve_plot_name(entry), rf.curves_figure(series, title))
                return {"evaluation_curves": name} if name else {}
        return {}

    def draw_summary(self, sink: Sink, result: Result) -> None:
        self._flush_sheet(sink, final=True)
        result.payload["contact_sheets"] = list(self.sheets)
        ev = result.payload.get("evaluation")
        if ev is not None and sink.out is not None and ev["average"]:
            from inspect_model.render import faithfulness as rf

            n = result.payload["image_count"]
            fig = rf.curves_figure(rf.average_series(ev), f"deletion and insertion curves, mean over {n} image(s)")
            name = sink.figure("evaluation_curves.png", fig)
            ev["plots"] = [name] if name else []

    def _flush_sheet(self, sink: Sink, *, final: bool) -> None:
        """A contact-sheet page when it is full (or at the end), when there are several
        images or several columns."""
        if sink.out is None or not self.sheet_rows:
            return
        if not final and len(self.sheet_rows) < SHEET_ROWS:
            return
        several = len(self.columns) > 1 or len(self.sheet_rows) > 1 or self.sheets
        if not several:
            self.sheet_rows = []
            return
        from inspect_model.render.overlay import SheetCell, contact_sheet

        while self.sheet_rows and (final or len(self.sheet_rows) >= SHEET_ROWS):
            rows, self.sheet_rows = self.sheet_rows[:SHEET_ROWS], self.sheet_rows[SHEET_ROWS:]
            cols = [f"{m} @ {lay}" for m, lay in self.columns]
            page = self.page_base + len(self.sheets) + 1

            def draw(rows: list[Any] = rows, cols: list[str] = cols, page: int = page) -> Any:
                # The cells are thumbnails that jobs queued before this one draw: a worker
                # waits for them (the queue is first in, first out, so they have started),
                # and the model computes on meanwhile.
                cells = [(label, [None if c is None else SheetCell(_thumb(c[0]), c[1]) for c in row])
                         for label, row in rows]
                return contact_sheet(cells, cols, title=f"class activation maps (page {page})")

            name = sink.image(f"contact_sheet_{page:03d}.png", draw, photo=True)
            if name is not None:
                self.sheets.append(name)


def _draw_map_job(sink: Sink, names: dict[str, Any], picture: Any, arr: Any, box: Any, alpha: float, cmap: str,
                  title: str, *, keep: bool) -> Any:
    """The work of one map, for a worker: the overlay and the heat map, drawn and written;
    gives (contact-sheet thumbnail, the overlay when ``keep``)."""
    from inspect_model.render import overlay as ov
    from inspect_model.render.files import png_bytes

    def job() -> tuple[Any, Any]:
        over = ov.overlay(picture, arr, box, alpha=alpha, cmap=cmap)
        if names and sink.out is not None:
            sink.out.write_staged(*names["overlay"], png_bytes(over, photo=True))
            sink.out.write_staged(*names["heatmap"], png_bytes(ov.heatmap_image(arr, title, cmap=cmap)))
        return ov.thumbnail(over), over if keep else None

    return job


def cam(model: Any, images: Any = None, *, methods: list[str] | None = None, layers: list[str] | None = None,
        target: str = "predicted", reshape: str | None = None, fuse: bool = False, output_key: str | None = None,
        scorecam_batch: int = 32, colormap: str = "jet", alpha: float = 0.5, top: int = 5,
        save_raw: bool = False, evaluate: bool = False, metrics: list[str] | None = None, boxes: Any = None,
        eval_steps: int = 32, eval_batch: int = 64, score_threshold: float | None = None, max_detections: int = 10,
        model_options: ModelOptions | None = None, inputs: InputOptions | None = None,
        output_dir: Any = None, force: bool = False, tensorboard: Any = None, keep: bool | None = None,
        on_item: Any = None, notes: Any = None, progress: Any = None) -> Result:
    """Class activation maps of ``images`` (paths, or a tensor (N, C, H, W)) under ``model``
    (a spec, an ``nn.Module`` or a ``LoadedModel``). The result's ``to_dict()`` is the CLI's
    ``--json``; ``save(dir)`` (or ``output_dir=``) writes the CLI's files. ``evaluate=True``
    adds faithfulness scores (``metrics``, default all; ``boxes``: a boxes file for the
    pointing and energy games; see :mod:`inspect_model.api.cam_evaluate`)."""
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    check_cam_request(methods=methods or ["gradcam"], layers=layers, reshape=reshape, fuse=fuse,
                      scorecam_batch=scorecam_batch, colormap=colormap, alpha=alpha, top=top)
    from inspect_model.api.cam_evaluate import check_evaluate_request

    check_evaluate_request(evaluate=evaluate, metrics=metrics, boxes=boxes, steps=eval_steps, batch=eval_batch)
    from inspect_model.methods.objectives import check_dense_options

    check_dense_options(score_threshold, max_detections)
    prep = prepare("cam", mopts, inputs, notes=notes)
    session = CamSession(prep, mopts, methods=methods, layers=layers, reshape=reshape, fuse=fuse, target=target,
                         output_key=output_key, scorecam_batch=scorecam_batch, colormap=colormap, alpha=alpha,
                         top=top, save_raw=save_raw, notes=notes, evaluate=evaluate, metrics=metrics, boxes=boxes,
                         eval_steps=eval_steps, eval_batch=eval_batch, progress=progress,
                         score_threshold=score_threshold, max_detections=max_detections)
    total = len(prep.plan.paths) if prep.plan.paths else 0
    return execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir, force=force,
                   keep=keep, tensorboard=tensorboard, on_item=on_item)


def _thumb(cell: Any) -> Any:
    """A contact-sheet thumbnail: a worker's future (its result's first item) or, after a
    resume, the image itself."""
    return cell.result()[0] if hasattr(cell, "result") else cell
