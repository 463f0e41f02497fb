"""``inspect-model activations MODEL [IMAGE ...]``: activation statistics and feature maps."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from inspect_model.cli import common as c
from inspect_model.cli.run import CommandRun, InputOptions
from inspect_model.cli.shared import RunOptions, command_run, shared_options

EXAMPLE = "inspect-model activations resnet34 cat.jpg --layers type:Conv2d[0] --output-dir acts"

ScaleOpt = Annotated[
    str, typer.Option("--scale", help="Feature-map colours: each (every tile its own min..max) or layer (one scale).")
]
MaxChannelsOpt = Annotated[
    int, typer.Option("--max-channels", help="Draw at most this many channels per layer (0: all).")
]
ChannelsOpt = Annotated[
    str | None,
    typer.Option("--channels", help="Channels to draw: top:N (most active first) or a list like 0,5,8-11."),
]
CmapOpt = Annotated[str, typer.Option("--colormap", "--cmap", help="Matplotlib colour map of the feature maps.")]
RawFormatOpt = Annotated[
    str, typer.Option("--raw-format", help="With --save-raw: npy (one file per layer and image) or npz (one per image).")
]



@shared_options(labels=False)
def activations(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    layers: c.LayersOpt = None,
    depth: c.DepthOpt = None,
    scale: ScaleOpt = "layer",
    max_channels: MaxChannelsOpt = 64,
    channels: ChannelsOpt = None,
    cmap: CmapOpt = "viridis",
    save_raw: c.SaveRawOpt = False,
    raw_format: RawFormatOpt = "npy",
    *,
    opts: c.ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Activation statistics of every layer, and feature-map grids of the layers you name.

    Hooks the selected layers (every leaf by default) for one forward pass per batch and
    reports, per layer and per call: output shape, mean, std, min, max, exact zeros,
    negatives, NaN/Inf counts, and channels dead (zero) for every image, merged over all
    images. With --output-dir: an overview PNG along the depth of the network and, for the
    layers given with --layers, one feature-map grid PNG per layer and image.
    Example: inspect-model activations resnet34 cat.jpg --layers type:Conv2d[0] --output-dir acts
    """
    from inspect_model.errors import UsageError
    from inspect_model.render.grids import SCALES, parse_channels

    if scale not in SCALES:
        raise UsageError(f"--scale '{scale}' is not one of {', '.join(SCALES)}")
    if raw_format not in ("npy", "npz"):
        raise UsageError(f"--raw-format '{raw_format}' is not npy or npz")
    spec = parse_channels(channels, max_channels)
    _check_cmap(cmap)
    with command_run("activations", run_opts, save_raw=save_raw) as run:
        act = _Run(run, opts, save_raw=save_raw, raw_format=raw_format, scale=scale, spec=spec, cmap=cmap)
        report, options = act.execute(inputs, layers=layers, depth=depth)
        from inspect_model.render import activations as render

        payload = render.to_payload(report, images=act.names, grids=act.grids)
        run.finish(payload, options, text=lambda files: render.render_text(report, files),
                   rich=lambda files: render.render_rich(report, files))


def _check_cmap(name: str) -> None:
    from matplotlib import colormaps

    from inspect_model.errors import UsageError, suggest

    if name not in colormaps:
        raise UsageError(f"--cmap '{name}' is not a matplotlib colour map"
                         + (suggest(name, list(colormaps)) or "; e.g. viridis, magma, gray"))


class _Run:
    """One activations run: load, select, stream batches (grids, raw arrays, JSON lines)."""

    def __init__(self, run: CommandRun, opts: c.ModelOptions, *, save_raw: bool, raw_format: str, scale: str,
                 spec: Any, cmap: str) -> None:
        self.run, self.opts, self.msgs, self.out, self.writer = run, opts, run.msgs, run.out, run.writer
        self.jsonl, self.save_raw, self.raw_format = run.jsonl, save_raw, raw_format
        self.scale, self.spec, self.cmap = scale, spec, cmap
        self.names: list[str] = []
        self.grids: list[dict[str, Any]] = []
        self._warned: set[str] = set()

    def warn(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            self.msgs.warn(text)

    def execute(self, inputs: InputOptions, *, layers: list[str] | None,
                depth: int | None) -> tuple[Any, dict[str, Any]]:
        from inspect_model.engine.selection import select_layers
        from inspect_model.errors import LayerSelectionError
        from inspect_model.methods.activations import ActivationCapture

        prep = self.run.prepare(self.opts, inputs)
        loaded, plan, dev = prep.loaded, prep.plan, prep.device
        if not getattr(loaded, "hookable", True):
            raise LayerSelectionError(
                f"{loaded.name} ({loaded.source}) has no module hooks, so layer outputs cannot be "
                "captured; export the model as a Python nn.Module (FILE.py:FACTORY) instead")
        net = loaded.model
        selected = select_layers(net, layers, depth=depth)
        wants_files = self.out is not None or self.writer is not None
        if layers:
            keep = list(selected) if wants_files else []
        elif self.save_raw:
            keep = list(selected)
            self.msgs.info("note: --save-raw without --layers saves every selected layer's output")
        else:
            keep = []
            if wants_files:
                self.msgs.info("note: no --layers given: statistics only; name layers with --layers "
                               "to draw their feature maps")
        draw = set(selected) if layers and wants_files else set()
        with ActivationCapture(net, selected, keep=keep, hist_bins=64 if self.writer is not None else 0,
                               model_name=loaded.name) as cap:
            for b, batch in enumerate(self.run.track(plan)):
                res = cap.run(batch.tensor, batch.names)
                self._batch(res, b, draw)
            report = cap.report()
        for path, reason in plan.skipped:
            self.warn(f"skipped '{path}': {reason}")
        for w in plan.warnings:  # per-image notes (first frame of an animated GIF...)
            self.warn(w)
        called = {r.name for r in report.layers}
        missing = [n for n in selected if n not in called]
        if missing:
            self.warn(f"{len(missing)} selected layer(s) never ran in the forward pass: "
                      + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
        if self.out is not None:
            from inspect_model.render.activations import render_overview

            fig = render_overview(report)
            self.out.save_figure("overview.png", fig)
        options = {
            "model": self.opts.model, "weights": self.opts.weights, "checkpoint":
                str(self.opts.checkpoint) if self.opts.checkpoint else None,
            "layers": list(layers or []), "depth": depth, "selected": len(selected),
            "scale": self.scale, "max_channels": self.spec.max_channels, "channels": self.spec.describe(),
            "cmap": self.cmap, "save_raw": self.save_raw, "raw_format": self.raw_format,
            "device": dev, "dtype": self.opts.dtype, "seed": inputs.seed, "preprocessing": plan.describe(),
            "tensorboard": None if self.writer is None else str(getattr(self.writer, "log_dir", "")),
        }
        return report, options

    def _batch(self, res: Any, b: int, draw: set[str]) -> None:
        from inspect_model.render.files import safe_name

        ids = []
        for img in res.images:
            self.names.append(img.name)
            ids.append(f"{img.index:04d}_{safe_name(_stem(img.name))}")
        per_image_files: dict[int, list[str]] = {i: [] for i in range(len(res.images))}
        npz: dict[int, dict[str, Any]] = {i: {} for i in range(len(res.images))}
        for k in res.kept:
            if not k.per_sample:
                if k.name in draw:
                    self.warn(f"layer '{k.key}': dim 0 of its output is not the batch; not drawn")
                if self.save_raw and self.out is not None:
                    self.out.save_npy(f"raw/batch-{b:04d}/{safe_name(k.key)}.npy", _numpy(k.tensor))
                continue
            for i in range(len(res.images)):
                sample = k.tensor[i]
                if k.name in draw:
                    per_image_files[i].extend(self._draw(k, sample, res.images[i], ids[i]))
                if self.save_raw and self.out is not None:
                    if self.raw_format == "npy":
                        per_image_files[i].append(
                            self.out.save_npy(f"raw/{ids[i]}/{safe_name(k.key)}.npy", _numpy(sample)))
                    else:
                        npz[i][k.key] = _numpy(sample)
        if self.save_raw and self.out is not None and self.raw_format == "npz":
            for i, arrays in npz.items():
                if arrays:
                    per_image_files[i].append(self.out.write_bytes(f"raw/{ids[i]}.npz", _npz_bytes(arrays)))
        if self.writer is not None:
            for key, (lo, hi, counts, num, s1, s2) in res.histograms.items():
                width = (hi - lo) / len(counts)
                self.writer.add_histogram_raw(
                    f"activations/{key}", min=lo, max=hi, num=num, sum=s1, sum_squares=s2,
                    bucket_limits=[lo + (j + 1) * width for j in range(len(counts))],
                    bucket_counts=counts, global_step=b)
        if self.jsonl:
            from inspect_model.render.activations import image_line

            for i, img in enumerate(res.images):
                self.run.line(image_line(img, per_image_files[i]))

    def _draw(self, k: Any, sample: Any, img: Any, image_id: str) -> list[str]:
        from inspect_model.render.files import safe_name
        from inspect_model.render.grids import figure_to_array, render_activation

        cdim = None if k.channel_dim is None else k.channel_dim - 1
        title = f"{k.key} ({k.type}) - {_basename(img.name)}"
        fig, layout = render_activation(_numpy(sample), cdim, title=title, channels=self.spec, scale=self.scale,
                                        cmap=self.cmap, layer=k.key)
        files: list[str] = []
        path = None
        if self.out is not None:
            path = self.out.save_figure(f"grids/{image_id}/{safe_name(k.key)}.png", fig)
            files.append(path)
        if self.writer is not None:
            self.writer.add_image(f"grids/{k.key}", figure_to_array(fig), global_step=img.index,
                                  dataformats="HWC")
        self.grids.append({"image": img.name, "layer": k.key, "file": path, "kind": layout.kind,
                           "rows": layout.rows, "cols": layout.cols, "channels": list(layout.channels),
                           "total_channels": layout.total_channels, "note": layout.note})
        return files


def _stem(name: str) -> str:
    from pathlib import Path

    return Path(name).stem or name


def _numpy(t: Any) -> Any:
    import torch

    x = t.detach()
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x.cpu().numpy()


def _npz_bytes(arrays: dict[str, Any]) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _basename(name: str) -> str:
    from pathlib import Path

    return Path(name).name or name
