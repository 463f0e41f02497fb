"""The files of ``guided-backprop``: per image (``images/NNNN-stem/``) ``guided.<class>.png``
(the display image), ``magnitude.<class>.png``, with guided Grad-CAM
``guided_gradcam.<class>.png``, with ``save_raw`` the ``.npy`` arrays, and ``overview.png``
(the input and every map, titled); TensorBoard images when a writer is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_model.output.files import class_tag, image_dir
from inspect_model.output.sink import Drawer, Sink
from inspect_model.render.labels import target_label


class GuidedDrawer(Drawer):
    """Draws what :class:`inspect_model.api.guided.GuidedSession` records."""

    def __init__(self, *, categories: list[str] | None, preprocess: Any, save_raw: bool, overview: bool,
                 warn: Callable[[str], None]) -> None:
        self.categories, self.preprocess = categories, preprocess
        self.save_raw, self.overview, self.warn = save_raw, overview, warn

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import saliency as render

        if item.data is None:
            return item.entry.get("files", {})
        x, grads, ggc = item.data
        entry, cats = item.entry, self.categories
        base = image_dir(entry["index"], entry["image"])
        rows = []
        for m in entry["maps"]:
            k, cls = m["rank"], m["target"]["class"]
            g = grads[k]
            tag = class_tag(cls, cats)
            files: dict[str, Any] = {}
            panels = []
            if render.is_image_map(g):
                guided_img, mag_img = render.display_image(g), render.magnitude_image(g)
                panels += [("guided backprop", guided_img), ("|guided| (sum over channels)", mag_img)]
                ggc_img = render.display_image(ggc[k]) if ggc is not None else None
                if ggc_img is not None:
                    panels.append(("guided Grad-CAM", ggc_img))
                if sink.out is not None:
                    files["guided"] = sink.image(f"{base}/guided.{tag}.png", guided_img)
                    files["magnitude"] = sink.image(f"{base}/magnitude.{tag}.png", mag_img)
                    if ggc_img is not None:
                        files["guided_gradcam"] = sink.image(f"{base}/guided_gradcam.{tag}.png", ggc_img)
                if sink.writer is not None:
                    import numpy as np

                    for key, img in (("guided", guided_img), ("magnitude", mag_img), ("guided_gradcam", ggc_img)):
                        if img is not None:
                            sink.writer.add_image(f"guided-backprop/{base.split('/', 1)[1]}/{tag}/{key}",
                                                  np.asarray(img.convert("RGB")), 0, dataformats="HWC")
            elif g.dim() == 4 and sink.out is not None:  # a clip's (C, T, H, W): strips and an animation
                from inspect_model.render.video import guided_clip_files

                pre = self.preprocess
                files.update(guided_clip_files(sink, base, tag, g, x, entry, mean=getattr(pre, "mean", None),
                                               std=getattr(pre, "std", None)))
            elif g.dim() == 2 and sink.out is not None:  # token embeddings (L, D): one cell per token (issue 42)
                from inspect_model.render.attributions import heatmap

                title = f"guided backprop\n{entry['image']}: {target_label(m['target'])}"
                tokens = (entry.get("text") or {}).get("tokens")
                files["tokens"] = sink.image(f"{base}/guided.{tag}.tokens.png", lambda g=g, t=title, tk=tokens: heatmap(
                    g, t, signed=True, tokens=tk))
            elif sink.out is not None and not self.save_raw:
                self.warn("the input is not an image (C, H, W); no PNGs written (use --save-raw for .npy)")
            if sink.out is not None and self.save_raw:
                files["raw"] = sink.npy(f"{base}/guided.{tag}.npy", g.numpy())
                if ggc is not None:
                    files["guided_gradcam_raw"] = sink.npy(f"{base}/guided_gradcam.{tag}.npy", ggc[k].numpy())
            m["files"] = files
            if panels:
                label = target_label(m["target"])
                rows.append((f"{label} ({m['target']['score']:.3g})", panels))
        out: dict[str, Any] = {}
        if sink.out is not None and self.overview and rows:
            pre = self.preprocess
            mean = pre.mean if pre is not None else None
            std = pre.std if pre is not None else None
            fig = render.overview_figure(render.input_image(x, mean, std), rows)
            out["overview"] = sink.figure(f"{base}/overview.png", fig)
        return out
