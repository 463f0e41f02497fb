"""``activations``: per-layer activation statistics and feature-map grids, as a session.

Files (drawn by :mod:`inspect_model.render.draw_activations`): ``overview.png`` at the top,
per image one grid per layer named with ``layers`` and, with ``save_raw``, the raw outputs.
Resumable and mergeable: the per-layer moments merge exactly (Chan et al.).
"""

from __future__ import annotations

from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import execute, prepare, tracked
from inspect_model.api.resume import count
from inspect_model.api.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import UsageError


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
        self.warnings = Warnings()
        self.batch_index = 0
        from inspect_model.render.draw_activations import ActivationsDrawer

        self.drawer = ActivationsDrawer(draw_layers=self.draw_layers, save_raw=save_raw, raw_format=raw_format,
                                        channels=self.spec, scale=scale, colormap=colormap, warn=self.warn)

    def warn(self, text: str) -> None:
        self.warnings.add(text)

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
        payload = {**render.to_payload(report, images=self.entries, grids=self.drawer.grids, drawn=drawn),
                   "skipped": skipped}
        return Result("activations", self.resolved_options(), payload, self.warnings.to_list(), record=report)

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(
            self.mopts, layers=self.layer_specs, depth=self.depth, selected=len(self.selected), scale=self.scale,
            max_channels=self.spec.max_channels, channels=self.spec.describe(), colormap=self.colormap,
            save_raw=self.save_raw, raw_format=self.raw_format)

    def line(self, item: ImageItem) -> dict[str, Any]:
        """``--jsonl``: the image's statistics per layer (richer than its report entry)."""
        from inspect_model.render.activations import image_line

        if item.data is None:
            return item.entry
        return {**image_line(item.data["image"]), "files": item.entry.get("files", {})}

    # ------------------------------------------------------------------ resumable, mergeable
    def start(self, index: int, batch: int, rank: int) -> None:
        super().start(index, batch, rank)
        self.capture.start(index)
        self.batch_index = batch

    def state_dict(self) -> dict[str, Any]:
        return {"capture": self.capture.state_dict(), "entries": self.entries, "drawer": self.drawer.state_dict(),
                "warnings": self.warnings, "batch_index": self.batch_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.capture.load_state_dict(state["capture"])
        self.entries = list(state["entries"])
        self.drawer.load_state_dict(state["drawer"])
        self.warnings = state["warnings"]
        self.batch_index = count(state["batch_index"], "the batch index")

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.capture.merge([st["capture"] for st in states])
        self.entries = [e for st in states for e in st["entries"]]
        self.drawer.merge([st["drawer"] for st in states])
        self.warnings.merge(st["warnings"] for st in states[1:])


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

