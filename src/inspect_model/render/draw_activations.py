"""The files of ``activations``: per image (``images/NNNN-stem/``) one grid ``<layer>.png``
per drawn layer and, with ``save_raw``, ``<layer>.npy`` (or one ``raw.npz``); outputs whose
dim 0 is not the batch under ``batches/NNNN/``; ``overview.png`` at the top; TensorBoard
histograms and grids when a writer is given.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inspect_model.output.files import image_dir, safe_name
from inspect_model.output.sink import Drawer, Sink


class ActivationsDrawer(Drawer):
    """Draws what :class:`inspect_model.api.activations.ActivationsSession` records. ``grids``
    (one entry per grid drawn, its layout once drawn) is the report's ``grids`` list."""

    def __init__(self, *, draw_layers: set[str], save_raw: bool, raw_format: str, channels: Any, scale: str,
                 colormap: str, warn: Callable[[str], None]) -> None:
        self.draw_layers, self.save_raw, self.raw_format = draw_layers, save_raw, raw_format
        self.channels, self.scale, self.colormap, self.warn = channels, scale, colormap, warn
        self.grids: list[dict[str, Any]] = []

    def reset(self) -> None:
        self.grids.clear()

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        if item.data is None:
            return item.entry.get("files", {})
        entry, data = item.entry, item.data
        base = image_dir(entry["index"], entry["image"])
        files: dict[str, Any] = {}
        npz: dict[str, Any] = {}
        for k, sample in data["kept"]:
            if k.name in self.draw_layers:
                path = self._grid(k, sample, entry, base, sink, data.get("frames", {}).get(k.key))
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
                    self.warn(f"layer '{k.key}': dim 0 of its output is not the batch; not drawn")
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

    def _grid(self, k: Any, sample: Any, entry: dict[str, Any], base: str, sink: Sink,
              frames: tuple[Any, str] | None = None) -> str | None:
        """``frames``: the output as (C, t, h, w) and its layout's note, for a clip layer whose
        output lies on a (t, h, w) grid (tokens, channels-last stages: api/activations.py)."""
        from inspect_model.render.grids import figure_to_array, render_activation

        cdim = None if k.channel_dim is None else k.channel_dim - 1
        if frames is not None:
            sample, cdim = frames[0], 0
        title = f"{k.key} ({k.type}) - {Path(entry['image']).name or entry['image']}"
        values, spec, scale, cmap = _numpy(sample), self.channels, self.scale, self.colormap
        picture: dict[str, Any] = {}

        def draw() -> Any:  # on a worker: drawing and encoding overlap the next batch
            if values.ndim == 4:  # (C, T, h, w): a clip's feature maps, one column per frame
                from inspect_model.render.video import render_frame_grid

                img, picture["layout"] = render_frame_grid(values, cdim or 0, title=title, channels=spec,
                                                           scale=scale, cmap=cmap, layer=k.key,
                                                           note=frames[1] if frames is not None else "")
                return img
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

    def draw_summary(self, sink: Sink, result: Any) -> None:
        from inspect_model.render.activations import render_overview

        sink.drain()  # every grid drawn: its layout is known
        result.payload["grids"] = self.entries()
        if sink.out is not None:
            sink.figure("overview.png", render_overview(result.record))

    def entries(self) -> list[dict[str, Any]]:
        """The report's ``grids``: each drawn grid and, once drawn, its layout."""
        return [_grid_entry(g) for g in self.grids]

    def flush(self, sink: Sink) -> None:
        sink.drain()

    def state_dict(self) -> dict[str, Any]:
        return {"grids": self.entries()}  # layouts as plain data, once their grids are drawn

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.grids = list(state["grids"])

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.grids = [g for st in states for g in st["grids"]]


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
