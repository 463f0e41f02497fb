"""``inspect-model cam MODEL IMAGE ...``: class activation maps per image, target, method and layer."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from inspect_model.cli import common as c
from inspect_model.cli.run import CommandRun, InputOptions
from inspect_model.cli.shared import RunOptions, command_run, shared_options

EXAMPLE = "inspect-model cam resnet50 cat.jpg --method gradcam --method scorecam --target top:2 -o cams"

MethodOpt = Annotated[
    list[str] | None,
    typer.Option("--method", "-m", help="cam, gradcam, gradcam++, xgradcam, layercam, hirescam, scorecam, "
                 "eigencam; all (cam where the net fits it + the five gradient methods, one pass) or "
                 "gradients (the five); repeatable. Default gradcam."),
]
LayerOpt = Annotated[
    list[str] | None,
    typer.Option("--layer", "-l", help="auto (last spatial layer; ViT/Swin: last block as a patch grid) "
                 "or a layer spec; repeat for one map per layer."),
]
ReshapeOpt = Annotated[
    str | None, typer.Option("--reshape", help="Patch grid HxW for a token layer (N, tokens, D); "
                                "leading class/register tokens are dropped.")
]
FuseOpt = Annotated[
    bool, typer.Option("--fuse", help="With several --layer: also a fused map (element-wise max of the "
                       "normalised maps).")
]
ScoreBatchOpt = Annotated[
    int, typer.Option("--scorecam-batch", help="Masked inputs per forward pass for scorecam.")
]
ColormapOpt = Annotated[str, typer.Option("--colormap", "--cmap", help="Matplotlib colormap of the heat maps.")]
AlphaOpt = Annotated[float, typer.Option("--alpha", help="Heat-map opacity in overlays, 0..1.")]
TopOpt = Annotated[int, typer.Option("--top", help="Predicted classes listed per image.")]
MAX_WARNINGS = 50
SHEET_ROWS = 16  # rows per contact-sheet page: memory stays bounded for any number of images


@shared_options()
def cam(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    method: MethodOpt = None,
    layer: LayerOpt = None,
    reshape: ReshapeOpt = None,
    fuse: FuseOpt = False,
    target: c.TargetOpt = "predicted",
    output_key: c.OutputKeyOpt = None,
    scorecam_batch: ScoreBatchOpt = 32,
    colormap: ColormapOpt = "jet",
    alpha: AlphaOpt = 0.5,
    top: TopOpt = 5,
    save_raw: c.SaveRawOpt = False,
    *,
    opts: c.ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Class activation maps: CAM, Grad-CAM, Grad-CAM++, XGrad-CAM, Layer-CAM, HiResCAM,
    Score-CAM and Eigen-CAM.

    All gradient methods come from one forward pass and a backward pass that stops at the
    layer. With --output-dir: per image, target, method and layer a heat-map overlay on the
    original image, the bare map with a colour bar, --save-raw .npy maps, and contact sheets.
    Example: inspect-model cam resnet50 cat.jpg --method gradcam --method scorecam --target top:2 -o cams
    """
    from inspect_model.errors import UsageError
    from inspect_model.methods.cam import parse_methods, parse_reshape
    from inspect_model.render.overlay import check_colormap

    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"--alpha must be between 0 and 1, got {alpha}")
    if scorecam_batch < 1:
        raise UsageError(f"--scorecam-batch must be 1 or more, got {scorecam_batch}")
    if top < 1:
        raise UsageError(f"--top must be 1 or more, got {top}")
    methods = parse_methods(method)
    grid = parse_reshape(reshape)
    if fuse and len(layer or []) < 2:
        raise UsageError("--fuse combines several layers; give --layer at least twice")
    check_colormap(colormap)
    with command_run("cam", run_opts, save_raw=save_raw) as run:
        cams = _Run(run, opts, methods=methods, method_items=method or ["gradcam"], save_raw=save_raw,
                    colormap=colormap, alpha=alpha, top=top)
        payload, options = cams.execute(inputs, layers=layer, reshape=grid, fuse=fuse, target=target,
                                        output_key=output_key, scorecam_batch=scorecam_batch)
        from inspect_model.render import cam_report as render

        for w in payload["warnings"]:
            run.msgs.warn(w)
        run.finish(payload, options, text=lambda files: render.render_text(payload),
                   rich=lambda files: render.render_rich(payload))


class _Run:
    """One cam run: load, resolve layers, stream batches, write files, build the payload."""

    def __init__(self, run: CommandRun, opts: c.ModelOptions, *, methods: list[str], method_items: list[str],
                 save_raw: bool, colormap: str, alpha: float, top: int) -> None:
        self.run, self.opts, self.msgs, self.out, self.writer = run, opts, run.msgs, run.out, run.writer
        jsonl, keep = run.jsonl, not run.jsonl
        self.method_items = method_items  # as typed: `all` makes CAM optional
        self.methods, self.jsonl, self.keep, self.save_raw = methods, jsonl, keep, save_raw
        self.colormap, self.alpha, self.top = colormap, alpha, top
        self.warnings: list[str] = []
        self.sheet_rows: list[Any] = []
        self.sheets: list[str] = []
        self.columns: list[tuple[str, str]] = []

    def warn(self, text: str) -> None:
        # Bounded: a large run with many empty maps must not grow the report without limit.
        if text in self.warnings:
            return
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(text)
        elif len(self.warnings) == MAX_WARNINGS:
            self.warnings.append("more warnings left out; see each map's warnings in --json/--jsonl")

    def execute(self, inputs: InputOptions, *, layers: list[str] | None, reshape: tuple[int, int] | None,
                fuse: bool, target: str, output_key: str | None,
                scorecam_batch: int) -> tuple[dict[str, Any], dict[str, Any]]:
        import itertools

        from inspect_model.errors import InputError
        from inspect_model.methods.cam import compute_cams, resolve_layers
        from inspect_model.methods.targets import parse_target

        prep = self.run.prepare(self.opts, inputs)
        loaded, plan, categories, dev, torch_dtype = prep.loaded, prep.plan, prep.categories, prep.device, prep.dtype
        seed = inputs.seed
        net = loaded.model
        spec = parse_target(target, categories)
        batches = self.run.track(plan)
        first = next(batches, None)
        if first is None:
            raise InputError("no input could be read; nothing to do")
        cam_layers = resolve_layers(net, first.tensor, layers, reshape)
        for lay in cam_layers:
            g = lay.layout.grid
            self.msgs.info(f"layer: {lay.name} ({lay.layout.kind}, {g[0]}x{g[1]} grid, {lay.layout.channels} channels)")
        n_images = len(plan.paths) if plan.paths else first.tensor.shape[0]
        if "scorecam" in self.methods:
            per = sum(lay.layout.channels for lay in cam_layers)
            total = per * n_images
            self.msgs.info(f"scorecam: {per} masked inputs per image ({n_images} image(s): {total} in all), "
                           f"run as {sum(-(-lay.layout.channels // scorecam_batch) for lay in cam_layers) * n_images}"
                           f" forward passes of up to {scorecam_batch} (--scorecam-batch)")
        names = [lay.name for lay in cam_layers] + (["fused:" + "+".join(lay.name for lay in cam_layers)]
                                                    if fuse and len(cam_layers) > 1 else [])
        self.columns = [(m, n) for n in names for m in self.methods]
        entries: list[dict[str, Any]] = []
        passes = {"forward": 0, "backward": 0, "scorecam_forward": 0}
        count = 0
        for batch in itertools.chain([first], batches):
            res = compute_cams(net, batch.tensor, layers=cam_layers, methods=self.method_items,
                               target=spec, output_key=output_key, scorecam_batch=scorecam_batch, fuse=fuse)
            for key in passes:
                passes[key] += res.passes[key]
            for note in res.notes:
                self.warn(note)
            for i in range(batch.tensor.shape[0]):
                entry = self._entry(count, batch, i, res, categories, plan.preprocess)
                count += 1
                if self.keep:
                    entries.append(entry)
                self.run.line(entry)
        self._flush_sheet(final=True)
        for path, reason in plan.skipped:
            self.warn(f"skipped {path}: {reason}")
        for w in plan.warnings:  # per-image notes (first frame of an animated GIF...)
            self.warn(w)
        payload = {
            "model": loaded.name,
            "methods": list(self.methods),
            "layers": [lay.describe() for lay in cam_layers],
            "target": spec.text,
            "fuse": bool(fuse and len(cam_layers) > 1),
            "images": entries,
            "image_count": count,
            "passes": passes,
            "contact_sheets": list(self.sheets),
            "warnings": list(self.warnings),
            "skipped": [{"path": p, "reason": r} for p, r in plan.skipped],
        }
        options = {
            "model": self.opts.model, "weights": loaded.weights if loaded.source == "torchvision" else self.opts.weights,
            "checkpoint": str(self.opts.checkpoint) if self.opts.checkpoint else None,
            "layers": [lay.name for lay in cam_layers], "layer_specs": list(layers or ["auto"]),
            "reshape": list(reshape) if reshape else None, "preprocessing": plan.describe(), "device": dev,
            "dtype": str(torch_dtype).replace("torch.", ""), "seed": seed, "target": target,
            "methods": list(self.methods), "fuse": fuse, "output_key": output_key, "batch_size": plan.batch_size,
            "scorecam_batch": scorecam_batch, "colormap": self.colormap, "alpha": self.alpha,
        }
        return payload, options

    # ------------------------------------------------------------------ per image
    def _entry(self, index: int, batch: Any, i: int, res: Any, categories: Any, pre: Any) -> dict[str, Any]:
        from pathlib import Path

        from inspect_model.render import overlay as ov
        from inspect_model.render.cam_report import image_record
        from inspect_model.render.files import safe_name

        name = batch.names[i]
        loaded_img = batch.images[i] if batch.images is not None else None
        if loaded_img is not None:
            picture = loaded_img.image
            box = pre.uncrop_box(*picture.size) if pre is not None else None
        else:
            picture = ov.input_picture(batch.tensor[i])
            box = None
        base = f"{index:04d}-{safe_name(Path(name).stem)}"
        files: dict[tuple[int, str, str], dict[str, str]] = {}
        rows: dict[int, dict[tuple[str, str], Any]] = {}
        probs = res.probabilities[i]
        for m in res.maps:
            if m.sample != i:
                continue
            cls = m.target
            cname = categories[cls] if categories and 0 <= cls < len(categories) else None
            tag = safe_name(f"c{cls}-{cname}" if cname else f"c{cls}")
            for w in m.warnings:
                self.warn(f"{name}: {m.method} at {m.layer} for class {cls}: {w}")
            needs_picture = self.out is not None or self.writer is not None
            if not needs_picture:
                continue
            arr = m.map.numpy()
            over = ov.overlay(picture, arr, box, alpha=self.alpha, cmap=self.colormap)
            title = f"{cls}{' ' + cname if cname else ''} p={float(probs[cls]):.3f}"
            rows.setdefault(m.rank, {})[(m.method, m.layer)] = ov.SheetCell(ov.thumbnail(over), title)
            if self.writer is not None:
                import numpy as np

                self.writer.add_image(f"cam/{m.method}/{m.layer}/rank{m.rank}", np.asarray(over), index,
                                      dataformats="HWC")
            if self.out is None:
                continue
            stem = f"{base}/{safe_name(m.method)}.{safe_name(m.layer)}.{tag}"
            f = {"overlay": self.out.save_image(f"{stem}.overlay.png", over)}
            fig = ov.heatmap_figure(arr, f"{m.method} @ {m.layer}\n{title}", cmap=self.colormap)
            f["heatmap"] = self.out.save_figure(f"{stem}.heatmap.png", fig)
            if self.save_raw:
                f["raw_input"] = self.out.save_npy(f"{stem}.input.npy", arr)
                if m.raw is not None:
                    f["raw_layer"] = self.out.save_npy(f"{stem}.layer.npy", m.raw.numpy())
            files[(m.rank, m.method, m.layer)] = f
        if self.out is not None:
            for rank in sorted(rows):
                cells = [rows[rank].get(col) for col in self.columns]
                self.sheet_rows.append((f"{Path(name).name} #{rank + 1}", cells))
            self._flush_sheet(final=False)
        size = list(loaded_img.image.size) if loaded_img is not None else None
        return image_record(res, i, index=index, name=name, size=size, categories=categories, files=files,
                            top=self.top)

    def _flush_sheet(self, *, final: bool) -> None:
        """Write a contact-sheet page when it is full (or at the end), when there are several
        images or several columns: rows = image x target, columns = method x layer."""
        if self.out is None or not self.sheet_rows:
            return
        if not final and len(self.sheet_rows) < SHEET_ROWS:
            return
        several = len(self.columns) > 1 or len(self.sheet_rows) > 1 or self.sheets
        if several:
            from inspect_model.render.overlay import contact_sheet

            rows, self.sheet_rows = self.sheet_rows[:SHEET_ROWS], self.sheet_rows[SHEET_ROWS:]
            cols = [f"{m} @ {lay}" for m, lay in self.columns]
            page = len(self.sheets) + 1
            fig = contact_sheet(rows, cols, title=f"class activation maps (page {page})")
            self.sheets.append(self.out.save_figure(f"contact_sheet_{page:03d}.png", fig))
            if final and self.sheet_rows:
                self._flush_sheet(final=True)
        else:
            self.sheet_rows = []
