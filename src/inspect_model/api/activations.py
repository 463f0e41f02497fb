"""``activations``: per-layer activation statistics and feature-map grids, as a session.

Files: ``overview.png`` (statistics along the depth) at the top; per image
(``images/NNNN-stem/``) one grid ``<layer>.png`` per drawn layer and, with ``save_raw``,
``<layer>.npy`` (or one ``raw.npz``). Outputs whose dim 0 is not the batch are saved per
batch under ``batches/NNNN/``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import (
    ImageItem,
    Result,
    Session,
    Sink,
    Warnings,
    execute,
    image_dir,
    input_outcome,
    prepare,
    tracked,
)
from inspect_model.errors import UsageError
from inspect_model.render.files import safe_name


def check_activations_request(*, scale: str, raw_format: str, channels: str | None, max_channels: int,
                              colormap: str) -> Any:
    from inspect_model.render.grids import SCALES, parse_channels
    from inspect_model.render.overlay import check_colormap

    if scale not in SCALES:
        raise UsageError(f"--scale '{scale}' is not one of {', '.join(SCALES)}")
    if raw_format not in ("npy", "npz"):
        raise UsageError(f"--raw-format '{raw_format}' is not npy or npz")
    if max_channels < 0:
        raise UsageError(f"--max-channels must be 0 (all) or more, got {max_channels}")
    check_colormap(colormap)
    return parse_channels(channels, max_channels)


QUANTIZED_DTYPES = ("quint8", "qint8", "qint32", "quint4x2", "quint2x4")


class ActivationsSession(Session):
    command = "activations"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, *, layers: list[str] | None = None,
                 depth: int | None = None, scale: str = "layer", max_channels: int = 64,
                 channels: str | None = None, colormap: str = "viridis", save_raw: bool = False,
                 raw_format: str = "npy", draw: bool = False, histograms: bool = False, notes: Any = None) -> None:
        from inspect_model.engine.selection import select_layers

        self.spec = check_activations_request(scale=scale, raw_format=raw_format, channels=channels,
                                              max_channels=max_channels, colormap=colormap)
        if depth is not None and depth < 0:
            raise UsageError(f"--depth must be 0 or more, got {depth}")
        self.prep, self.mopts = prep, mopts
        self.layer_specs, self.depth, self.scale, self.colormap = list(layers or []), depth, scale, colormap
        self.save_raw, self.raw_format = save_raw, raw_format
        notes = notes or (lambda text: None)
        net = prep.loaded.model
        self.selected = select_layers(net, layers, depth=depth)
        if layers:
            keep = list(self.selected) if draw or save_raw else []
        elif save_raw:
            keep = list(self.selected)
            notes("--save-raw without --layer saves every selected layer's output")
        else:
            keep = []
            if draw:
                notes("no --layer given: statistics only; name layers with --layer to draw their feature maps")
        self.draw_layers = set(self.selected) if layers and draw else set()
        from inspect_model.methods.activations import ActivationCapture

        self.capture = ActivationCapture(net, self.selected, keep=keep, hist_bins=64 if histograms else 0,
                                         model_name=prep.loaded.name)
        self.entries: list[dict[str, Any]] = []
        self.grids: list[dict[str, Any]] = []
        self.warnings = Warnings()
        self.batch_index = 0

    def __enter__(self) -> ActivationsSession:
        self.capture.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.capture.__exit__(*exc)

    def feed(self, batch: Any) -> list[ImageItem]:
        res = self.capture.run(batch.tensor, batch.names)
        b = self.batch_index
        self.batch_index += 1
        items = []
        per_sample = [k for k in res.kept if k.per_sample]
        batch_level = [k for k in res.kept if not k.per_sample]
        for i, img in enumerate(res.images):
            entry = {"index": img.index, "image": img.name, "files": {}}
            self.entries.append(entry)
            data = {"kept": [(k, k.tensor[i]) for k in per_sample], "image": img,
                    "batch": (b, batch_level) if i == 0 else None, "hist": res.histograms if i == 0 else None}
            items.append(ImageItem(entry, data))
        return items

    def finish(self) -> Result:
        from inspect_model.render import activations as render

        report = self.capture.report()
        plan = self.prep.plan
        skipped = input_outcome(plan, self.warnings)
        called = {r.name for r in report.layers}
        missing = [n for n in self.selected if n not in called]
        if missing:
            self.warnings.add(f"{len(missing)} selected layer(s) never ran in the forward pass: "
                              + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
        # The layers named with --layer: drawn into the output directory when there is one.
        drawn = list(self.selected) if self.layer_specs else []
        payload = {**render.to_payload(report, images=self.entries, grids=self.grids, drawn=drawn),
                   "skipped": skipped}
        quantized = [r.key for r in report.layers if r.dtype in QUANTIZED_DTYPES]
        tail = ""
        if quantized:  # the engine dequantizes them (engine/hooks.py)
            payload["quantized_layers"] = {"count": len(quantized), "statistics": "dequantized values"}
            kinds = ", ".join(sorted({r.dtype for r in report.layers if r.dtype in QUANTIZED_DTYPES}))
            tail = (f"Quantized: {len(quantized)} row(s) output quantized tensors ({kinds}); their statistics "
                    "and pictures are of the dequantized values\n")
        options = self.prep.options(
            self.mopts, layers=self.layer_specs, depth=self.depth, selected=len(self.selected), scale=self.scale,
            max_channels=self.spec.max_channels, channels=self.spec.describe(), colormap=self.colormap,
            save_raw=self.save_raw, raw_format=self.raw_format)
        return Result("activations", options, payload, self.warnings.to_list(), record=report,
                      render_text=lambda r: render.render_text(report, r.files, r.warnings, drawn) + tail,
                      render_rich=lambda r: render.render_rich(report, r.files, r.warnings, drawn))

    def line(self, item: ImageItem) -> dict[str, Any]:
        """``--jsonl``: the image's statistics per layer (richer than its report entry)."""
        from inspect_model.render.activations import image_line

        if item.data is None:
            return item.entry
        return {**image_line(item.data["image"]), "files": item.entry.get("files", {})}

    # ------------------------------------------------------------------ drawing
    def reset_drawing(self) -> None:
        self.grids.clear()

    def draw(self, item: ImageItem, sink: Sink) -> dict[str, Any]:
        if item.data is None:
            return item.entry.get("files", {})
        entry, data = item.entry, item.data
        base = image_dir(entry["index"], entry["image"])
        files: dict[str, Any] = {}
        npz: dict[str, Any] = {}
        for k, sample in data["kept"]:
            if k.name in self.draw_layers:
                path = self._grid(k, sample, entry, base, sink)
                if path is not None:
                    files[f"grid:{k.key}"] = path
            if self.save_raw and sink.out is not None:
                if self.raw_format == "npy":
                    files[f"raw:{k.key}"] = sink.npy(f"{base}/{safe_name(k.key)}.npy", _numpy(sample))
                else:
                    npz[k.key] = _numpy(sample)
        if npz:
            buf = io.BytesIO()
            import numpy as np

            np.savez(buf, **npz)
            files["raw"] = sink.data(f"{base}/raw.npz", buf.getvalue())
        if data["batch"] is not None:
            b, batch_level = data["batch"]
            for k in batch_level:
                if k.name in self.draw_layers:
                    self.warnings.add(f"layer '{k.key}': dim 0 of its output is not the batch; not drawn")
                if self.save_raw and sink.out is not None:
                    sink.npy(f"batches/{b:04d}/{safe_name(k.key)}.npy", _numpy(k.tensor))
        if sink.writer is not None and data["hist"]:
            for key, (lo, hi, counts, num, s1, s2) in data["hist"].items():
                width = (hi - lo) / len(counts)
                sink.writer.add_histogram_raw(
                    f"activations/{key}", min=lo, max=hi, num=num, sum=s1, sum_squares=s2,
                    bucket_limits=[lo + (j + 1) * width for j in range(len(counts))],
                    bucket_counts=counts, global_step=entry["index"])
        return files

    def _grid(self, k: Any, sample: Any, entry: dict[str, Any], base: str, sink: Sink) -> str | None:
        from inspect_model.render.grids import figure_to_array, render_activation

        cdim = None if k.channel_dim is None else k.channel_dim - 1
        title = f"{k.key} ({k.type}) - {Path(entry['image']).name or entry['image']}"
        values, spec, scale, cmap = _numpy(sample), self.spec, self.scale, self.colormap
        picture: dict[str, Any] = {}

        def draw() -> Any:  # on a worker: drawing and encoding overlap the next batch
            img, picture["layout"] = render_activation(values, cdim, title=title, channels=spec, scale=scale,
                                                       cmap=cmap, layer=k.key)
            return img

        if sink.writer is not None:
            img = draw()
            sink.writer.add_image(f"grids/{k.key}", figure_to_array(img), global_step=entry["index"],
                                  dataformats="HWC")
            path = sink.image(f"{base}/{safe_name(k.key)}.png", img)
        else:
            path = sink.image(f"{base}/{safe_name(k.key)}.png", draw)
        self.grids.append({"image": entry["image"], "layer": k.key, "file": path, "_layout": picture})
        return path

    def draw_summary(self, sink: Sink, result: Result) -> None:
        from inspect_model.render.activations import render_overview

        sink.drain()  # every grid drawn: its layout is known
        result.payload["grids"] = [_grid_entry(g) for g in self.grids]
        if sink.out is not None:
            sink.figure("overview.png", render_overview(result.record))


def _grid_entry(g: dict[str, Any]) -> dict[str, Any]:
    if "_layout" not in g:
        return g
    layout = g["_layout"]["layout"]
    return {"image": g["image"], "layer": g["layer"], "file": g["file"], "kind": layout.kind, "rows": layout.rows,
            "cols": layout.cols, "channels": list(layout.channels), "total_channels": layout.total_channels,
            "note": layout.note}


def _numpy(t: Any) -> Any:
    import torch

    x = t.detach()
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x.cpu().numpy()


def activations(model: Any, images: Any = None, *, layers: list[str] | None = None, depth: int | None = None,
                scale: str = "layer", max_channels: int = 64, channels: str | None = None,
                colormap: str = "viridis", save_raw: bool = False, raw_format: str = "npy",
                model_options: ModelOptions | None = None, inputs: InputOptions | None = None,
                output_dir: Any = None, force: bool = False, tensorboard: Any = None, keep: bool | None = None,
                on_item: Any = None, notes: Any = None, progress: Any = None) -> Result:
    """Activation statistics of every selected layer (every leaf by default), merged over all
    inputs, and feature-map grids of the layers named in ``layers`` (when files are written)."""
    check_activations_request(scale=scale, raw_format=raw_format, channels=channels, max_channels=max_channels,
                              colormap=colormap)
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    prep = prepare("activations", mopts, inputs, notes=notes)
    keep = output_dir is None if keep is None else keep
    draw = output_dir is not None or tensorboard is not None or keep
    with ActivationsSession(prep, mopts, layers=layers, depth=depth, scale=scale, max_channels=max_channels,
                            channels=channels, colormap=colormap, save_raw=save_raw, raw_format=raw_format,
                            draw=draw, histograms=tensorboard is not None, notes=notes) as session:
        total = len(prep.plan.paths) if prep.plan.paths else 0
        result = execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir,
                         force=force, keep=keep, tensorboard=tensorboard, on_item=on_item)
    return result

