"""The ``activations`` report's body and ``--jsonl`` lines as typed records
(:mod:`inspect_model.reports.activations`), built from an
:class:`~inspect_model.methods.activations.capture.ActivationReport` (issue 35: built here,
not in render/; render/activations.py only formats)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.reports.activations import ImageLine, Layer, LayerLayout, LineLayer, Stats
from inspect_model.reports.base import ABSENT

if TYPE_CHECKING:
    from inspect_model.methods.activations.capture import (
        ActivationReport, ActivationStats, ImageActivations, LayerActivation)


def stats_entry(s: ActivationStats) -> Stats:
    return Stats(numel=s.numel, mean=s.mean, std=s.std, min=s.min, max=s.max, zero_fraction=s.zero_fraction,
                 negative_fraction=s.negative_fraction, nan_count=s.nan_count, inf_count=s.inf_count)


def layer_entry(r: LayerActivation, drawn: list[str] | None = None,
                layout: dict[str, Any] | None = None) -> Layer:
    """One row of the layer table; ``layout``: a drawn clip layer's (frames, h, w) layout."""
    return Layer(key=r.key, name=r.name, type=r.type, call_index=r.call_index, calls=r.calls, depth=r.depth,
                 order=r.order, output_key=r.output_key, shape=list(r.shape), dtype=r.dtype,
                 per_image=r.per_sample, stats=stats_entry(r.stats), channel_dim=r.channel_dim,
                 channels=r.channels, dead_channels=r.dead_channels,
                 dead_channel_fraction=r.dead_channel_fraction, channel_means=list(r.channel_means),
                 drawn=r.kept if drawn is None else r.name in drawn,
                 layout=ABSENT if layout is None else LayerLayout(**layout))


def activations_payload(rep: ActivationReport, *, images: list[dict[str, Any]] | None = None,
                        grids: list[dict[str, Any]] | None = None, drawn: list[str] | None = None,
                        layouts: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's body. ``drawn``: the layers named for drawing (default: those kept)."""
    drawn = list(rep.kept_layers) if drawn is None else drawn
    layouts = layouts or {}
    return {
        "model": rep.model,
        "image_count": rep.images,
        "images": list(images or []),
        "batches": rep.batches,
        "aggregation": "merged over the real tokens of every text, padding left out (exact: per-text moments "
                       "combined)" if rep.real_tokens else "merged over all images (exact: per-image moments combined)",
        "selected_layers": list(rep.selected),
        "drawn_layers": drawn,
        "layers": [layer_entry(r, drawn, layouts.get(r.key)).to_dict() for r in rep.layers],
        "grids": list(grids or []),
    }


def image_line(img: ImageActivations, files: Any = None) -> ImageLine:
    """One ``--jsonl`` object: one image's statistics per row."""
    layers = [LineLayer(key=s.key, dead_channel_fraction=s.dead_channel_fraction, **stats_entry(s.stats).fields())
              for s in img.layers]
    return ImageLine(image=img.name, index=img.index, layers=layers, files=files if files is not None else [])
