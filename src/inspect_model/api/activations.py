"""``activations``: per-layer activation statistics and feature-map grids, as a session.

Files (drawn by :mod:`inspect_model.render.draw_activations`): ``overview.png`` at the top,
per image one grid per layer named with ``layers`` and, with ``save_raw``, the raw outputs.
Resumable and mergeable: the per-layer moments merge exactly (Chan et al.).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run import option_groups as og
from inspect_model.run.option_groups import Layers, Picture
from inspect_model.run.request import DEPTH_HELP, Request, api_command, one_of, option, positive
from inspect_model.run.resume import count
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import UsageError
from inspect_model.registry import command
from inspect_model.reports.activations import ActivationsReport
from inspect_model.render import html_columns, results


@dataclass(frozen=True)
class ActivationsRequest(Request):
    """The options of ``activations``; validated once, here."""

    command: ClassVar[str] = "activations"
    groups: ClassVar[tuple[Any, ...]] = (Picture, Layers)

    layers: tuple[str, ...] = og.layers()
    depth: int | None = option(None, "--depth", type=int, help=DEPTH_HELP)
    scale: str = option("layer", "--scale", help="Feature-map colours: each (every tile its own min..max) or layer "
                        "(one scale).")
    max_channels: int = option(64, "--max-channels", help="Draw at most this many channels per layer (0: all).")
    channels: str | None = option(None, "--channels", type=str, help="Channels to draw: top:N (most active first) "
                                  "or a list like 0,5,8-11.")
    colormap: str = og.colormap("viridis")
    save_raw: bool = og.save_raw()
    raw_format: str = option("npy", "--raw-format", help="With --save-raw: npy (one file per layer and image) or "
                             "npz (one per image).")

    def validate(self) -> None:
        from inspect_model.render.grids import SCALES, parse_channels

        one_of(self.scale, SCALES, "--scale")
        if self.raw_format not in ("npy", "npz"):
            raise UsageError(f"--raw-format '{self.raw_format}' is not npy or npz")
        positive(self.max_channels, "--max-channels", zero=True)
        positive(self.depth, "--depth", zero=True)
        self._set("channel_spec", parse_channels(self.channels, self.max_channels))


class ActivationsSession(Session):
    command = "activations"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, request: ActivationsRequest, *, draw: bool = False,
                 histograms: bool = False, notes: Any = None) -> None:
        from inspect_model.engine.selection import select_layers

        r = self.request = request
        layers, depth, save_raw = list(r.layers) or None, r.depth, r.save_raw
        self.spec = r.channel_spec
        self.prep, self.mopts = prep, mopts
        self.layer_specs, self.depth, self.scale, self.colormap = list(r.layers), depth, r.scale, r.colormap
        self.save_raw, self.raw_format = save_raw, r.raw_format
        notes = self.notes = notes or (lambda text: None)
        net = prep.loaded.model
        self.selected = select_layers(net, layers, depth=depth)
        if not layers:  # rotary cos/sin tables are no activations of the input: listed only when named
            from inspect_model.methods.activations.tokens import position_tables

            tables = position_tables(net, self.selected)
            if tables:
                self.selected = [n for n in self.selected if n not in tables]
                notes(f"{', '.join(tables)} left out: position tables (rotary cos/sin), not activations of the "
                      "input; name it with --layer to see them")
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
        from inspect_model.methods.activations.capture import ActivationCapture

        self.capture = ActivationCapture(net, self.selected, keep=keep, hist_bins=64 if histograms else 0,
                                         model_name=prep.loaded.name)
        self.entries: list[dict[str, Any]] = []
        self.layouts: dict[str, dict[str, Any]] = {}  # a clip layer's (t, h, w) layout, by output key
        self.warnings = Warnings()
        self.batch_index = 0
        from inspect_model.methods.token_positions import position_stats

        self.positions = position_stats(prep, list(r.layers) or None)  # --text: per token position (issue 26)
        from inspect_model.render.draw_activations import ActivationsDrawer

        self.drawer = ActivationsDrawer(draw_layers=self.draw_layers, save_raw=save_raw, raw_format=self.raw_format,
                                        channels=self.spec, scale=self.scale, colormap=self.colormap, warn=self.warn)

    def warn(self, text: str) -> None:
        self.warnings.add(text)

    def __enter__(self) -> ActivationsSession:
        self.capture.__enter__()
        if self.positions is not None:
            try:
                self.positions.__enter__()
            except BaseException:
                self.capture.__exit__(None, None, None)
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.positions is not None:
                self.positions.__exit__(None, None, None)
        finally:
            self.capture.__exit__(*exc)

    def feed(self, batch: Any) -> list[ImageItem]:
        text = getattr(batch, "text", None)  # texts: statistics over their real tokens, padding left out
        res = self.capture.run(batch.tensor, batch.names, mask=text.mask if text is not None else None)
        b = self.batch_index
        self.batch_index += 1
        items = []
        per_sample = [k for k in res.kept if k.per_sample]
        batch_level = [k for k in res.kept if not k.per_sample]
        from inspect_model.methods.cam.video import as_frames

        grids = self._clip_layouts(per_sample, tuple(batch.tensor.shape[2:]) if batch.tensor.dim() == 5 else None)
        for i, img in enumerate(res.images):
            entry = {"index": img.index, "image": img.name, "files": {}}
            if getattr(batch, "text", None) is not None:
                entry["text"] = {"text": batch.text.texts[i], "tokens": batch.text.tokens[i]}
            self.entries.append(entry)
            kept = [(k, k.tensor[i]) for k in per_sample]
            if getattr(batch, "text", None) is not None:  # a text's grids and raw arrays: its real tokens only
                n, width = batch.text.lengths[i], int(batch.tensor.shape[1])
                kept = [(k, t[:n] if t.dim() >= 1 and t.shape[0] == width else t) for k, t in kept]
            data = {"kept": kept, "image": img,
                    "batch": (b, batch_level) if i == 0 else None, "hist": res.histograms if i == 0 else None,
                    "frames": {key: (as_frames(t[i], lay), self.layouts[key]["note"])
                               for key, (t, lay) in grids.items()}}
            items.append(ImageItem(entry, data))
        return items

    def _clip_layouts(self, kept: list[Any], thw: tuple[int, ...] | None) -> dict[str, Any]:
        """Drawn clip layers whose output lies on a (t, h, w) grid (3-D conv maps, Swin3D's
        channels-last stages, MViT's tokens: methods/cam/video.py): key -> (output, layout);
        each layout noted once and kept for the report's layer rows."""
        from inspect_model.methods.cam.video import clip_layout, layout_note

        out: dict[str, Any] = {}
        for k in kept if thw is not None else []:
            lay = clip_layout(self.prep.loaded.model, k.name, tuple(k.tensor.shape), thw) \
                if k.name in self.draw_layers else None
            if lay is None:
                continue
            out[k.key] = (k.tensor, lay)
            if k.key not in self.layouts:
                note = layout_note(lay, int(k.tensor.shape[1]) if lay.kind == "tokens" else None)
                self.layouts[k.key] = {**lay.describe(), "note": note}
                self.notes(f"layer {k.key}: {note}")
        return out

    def finish(self) -> Result:
        from inspect_model.methods.activations.entries import activations_payload
        from inspect_model.render import activations as render

        report = self.capture.report()
        plan = self.prep.plan
        report.real_tokens = getattr(plan, "texts", None) is not None
        skipped = input_outcome(plan, self.warnings)
        called = {r.name for r in report.layers}
        missing = [n for n in self.selected if n not in called]
        if missing:
            self.warnings.add(f"{len(missing)} selected layer(s) never ran in the forward pass: "
                              + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
        # The layers named with --layer: drawn into the output directory when there is one.
        drawn = list(self.selected) if self.layer_specs else []
        payload = {**activations_payload(report, images=self.entries, grids=self.drawer.grids, drawn=drawn,
                                         layouts=self.layouts), "skipped": skipped}
        if self.positions is not None:
            payload["positions"] = self.positions.report()
        quantized = [r.key for r in report.layers if r.dtype in render.QUANTIZED_DTYPES]
        if quantized:  # the engine dequantizes them (engine/hooks.py)
            payload["quantized_layers"] = {"count": len(quantized), "statistics": "dequantized values"}
        return Result("activations", self.resolved_options(), payload, self.warnings.to_list(), record=report)

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(
            self.mopts, layers=self.layer_specs, depth=self.depth, selected=len(self.selected), scale=self.scale,
            max_channels=self.spec.max_channels, channels=self.spec.describe(), colormap=self.colormap,
            save_raw=self.save_raw, raw_format=self.raw_format)

    def line(self, item: ImageItem) -> dict[str, Any]:
        """``--jsonl``: the image's statistics per layer (richer than its report entry)."""
        from inspect_model.methods.activations.entries import image_line

        if item.data is None:
            return item.entry
        return image_line(item.data["image"], item.entry.get("files", {})).to_dict()

    # ------------------------------------------------------------------ resumable, mergeable
    def start(self, index: int, batch: int, rank: int) -> None:
        super().start(index, batch, rank)
        self.capture.start(index)
        self.batch_index = batch

    def state_dict(self) -> dict[str, Any]:
        return {"capture": self.capture.state_dict(), "entries": self.entries, "drawer": self.drawer.state_dict(),
                "warnings": self.warnings, "batch_index": self.batch_index, "layouts": self.layouts,
                "positions": self.positions.state_dict() if self.positions is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.capture.load_state_dict(state["capture"])
        self.entries = list(state["entries"])
        self.drawer.load_state_dict(state["drawer"])
        self.warnings = state["warnings"]
        self.batch_index = count(state["batch_index"], "the batch index")
        self.layouts = dict(state.get("layouts") or {})
        if self.positions is not None and state.get("positions") is not None:
            self.positions.merge([state["positions"]])

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.capture.merge([st["capture"] for st in states])
        self.entries = [e for st in states for e in st["entries"]]
        self.drawer.merge([st["drawer"] for st in states])
        self.layouts = {k: v for st in states for k, v in (st.get("layouts") or {}).items()}
        if self.positions is not None:
            self.positions.merge([st["positions"] for st in states if st.get("positions") is not None])
        self.warnings.merge(st["warnings"] for st in states[1:])


@command(
    "activations",
    usage="activations MODEL [IMAGE...]",
    order=30,
    summary="per-layer activation statistics, feature-map grids",
    help=("Activation statistics of every layer, and feature-map grids of the layers you "
          "name.\n\nHooks the selected layers (every leaf by default) for one forward pass per "
          "batch and reports, per layer and per call: output shape, mean, std, min, max, exact "
          "zeros, negatives, NaN/Inf counts, and channels dead (zero) for every image, merged "
          "over all images. With --output-dir: an overview PNG along the depth of the network "
          "and, for the layers given with --layers, one feature-map grid PNG per layer and image."),
    example="inspect-model activations resnet34 cat.jpg --layer type:Conv2d[0] --output-dir acts",
    renderer=results.activations_report,
    tables=html_columns.activations_tables,
    schema="activations.json",
    report=ActivationsReport,
    resumable=True,
    labels=False,
    text=True,
)
@api_command(ActivationsRequest)
def activations(model: Any, images: Any, request: ActivationsRequest, call: Call) -> Result:
    """Activation statistics of every selected layer (every leaf by default), merged over all
    inputs, and feature-map grids of the layers named in ``layers`` (when files are written);
    the options of :class:`ActivationsRequest` as keywords."""
    # The session is a context manager (its capture's hooks): run_images enters it around the run.
    return call.run_images("activations", model, images, request, lambda prep, mopts, keep: ActivationsSession(
        prep, mopts, request, draw=call.output_dir is not None or call.tensorboard is not None or keep,
        histograms=call.tensorboard is not None, notes=call.notes))
