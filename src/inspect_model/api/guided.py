"""``guided-backprop``: guided backpropagation maps per image and target, as a session.

Files per image (``images/NNNN-stem/``): ``guided.<class>.png`` (the display image),
``magnitude.<class>.png``, with ``guided_gradcam`` ``guided_gradcam.<class>.png``, with
``save_raw`` the ``.npy`` arrays, and ``overview.png`` (the input and every map, titled).
"""

from __future__ import annotations

import math
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


def check_guided_request(*, layer: str, guided_gradcam: bool, output_key: str | None) -> None:
    if layer != "auto" and not guided_gradcam:
        raise UsageError("--layer applies to --guided-gradcam; add --guided-gradcam or drop --layer")
    if guided_gradcam and output_key is not None:
        raise UsageError("--guided-gradcam uses the model's first output; drop --output-key")


class GuidedSession(Session):
    command = "guided-backprop"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, *, target: str = "predicted", activations: bool = False,
                 guided_gradcam: bool = False, layer: str = "auto", sanity: bool = False,
                 output_key: str | None = None, save_raw: bool = False, overview: bool = True,
                 keep_gradients: bool = False, progress: Any = None, score_threshold: float | None = None,
                 max_detections: int = 10) -> None:
        from inspect_model.methods import guided as gb
        from inspect_model.methods.objectives import task_objective
        from inspect_model.methods.targets import parse_target

        check_guided_request(layer=layer, guided_gradcam=guided_gradcam, output_key=output_key)
        self.prep, self.mopts = prep, mopts
        # A detector's or segmenter's scores (issue 24); None for a classifier.
        self.objective = task_objective(prep.loaded, target, prep.categories, score_threshold=score_threshold,
                                        max_detections=max_detections, refuse={"--sanity": sanity})
        self.target_text = target
        self.spec = parse_target(target, prep.categories) if self.objective is None else self.objective.spec
        self.kinds = gb.resolve_kinds(activations)
        self.guided_gradcam, self.layer, self.sanity = guided_gradcam, layer, sanity
        self.output_key, self.save_raw, self.overview = output_key, save_raw, overview
        self.keep_gradients = keep_gradients
        self.progress = progress
        self.gradients: list[Any] = []
        self.cam_layer: str | None = None
        self.sites: dict[str, int] | None = None
        self.unguided: dict[str, int] = {}
        self.sanity_acc: dict[str, Any] | None = None
        self.entries: list[dict[str, Any]] = []
        self.warnings = Warnings()

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods import guided as gb

        model, x, cats = self.prep.loaded.model, batch.tensor, self.prep.categories
        res = gb.guided_backprop(model, x, self.spec, activations=self.kinds, output_key=self.output_key,
                                 categories=cats, objective=self.objective)
        self.warnings.extend(res.warnings)
        if self.objective is not None:
            from inspect_model.methods.objectives import Selection

            self.objective.note_empty(model, x, Selection(None, res.rows or []), batch.names)
        if self.sites is None:
            self.sites, self.unguided = res.sites, res.unguided
        ggc = None
        if self.guided_gradcam:
            from inspect_model.methods import cam

            if self.cam_layer is None and self.objective is None:
                self.cam_layer = cam.resolve_layer(model, self.layer, x[:1])
            if self.objective is not None:
                from inspect_model.methods.dense_guided import dense_gradcam

                self.cam_layer, maps = dense_gradcam(model, x, self.objective, self.layer, res)
            else:
                maps = cam.gradcam(model, x, self.cam_layer, res.targets).detach().float().cpu()
            ggc = gb.guided_gradcam(res.gradients, maps)
        if self.sanity:
            self.sanity_acc = _merge_sanity(self.sanity_acc, gb.sanity_check(
                model, x, res, seed=self.prep.plan.seed, output_key=self.output_key, progress=self.progress))
        if self.keep_gradients:
            self.gradients.append(res.gradients)
        items = []
        for i in range(x.shape[0]):
            entry = self._entry(self.index_base + len(self.entries), batch.names[i], res, i)
            self.entries.append(entry)
            items.append(ImageItem(entry, (x[i].detach().float().cpu(), res.gradients[i],
                                           None if ggc is None else ggc[i])))
        return items

    def _entry(self, index: int, name: str, res: Any, i: int) -> dict[str, Any]:
        from inspect_model.render.cam_report import class_name

        maps = []
        for k, cls in enumerate(res.targets[i]):
            g = res.gradients[i, k]
            a = g.abs()
            maps.append({
                "rank": k,
                "target": {"class": cls, "label": class_name(cls, self.prep.categories), "score": res.scores[i][k]},
                "max_abs": float(a.max()), "mean_abs": float(a.mean()),
                "nonzero_fraction": float((g != 0).float().mean()), "files": {},
            })
            if res.rows is not None:  # the detection or segmentation target this map explains
                row = [r for r in res.rows if r.sample == i][k]
                maps[-1][self.objective.task] = row.record()
        return {"index": index, "image": name, "targets": [int(t) for t in res.targets[i]], "maps": maps,
                "files": {}}

    def finish(self) -> Result:
        from inspect_model.methods import guided as gb
        from inspect_model.render import saliency as render

        plan = self.prep.plan
        skipped = input_outcome(plan, self.warnings)
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        payload = {
            "model": self.prep.loaded.name,
            "method": "guided_backprop",
            "activations": list(self.kinds),
            "sites": self.sites or {},
            "unguided_sites": self.unguided,
            "images": self.entries,
            "image_count": len(self.entries),
            "guided_gradcam": {"layer": self.cam_layer} if self.cam_layer else None,
            "sanity": _finish_sanity(self.sanity_acc),
            "notes": [gb.ADEBAYO_NOTE],
            "skipped": skipped,
        }
        options = self.prep.options(
            self.mopts, layers=[self.cam_layer] if self.cam_layer else [], target=self.target_text,
            activations=list(self.kinds), guided_gradcam=self.guided_gradcam, sanity=self.sanity,
            output_key=self.output_key, save_raw=self.save_raw, overview=self.overview)
        record = _GuidedRecord(self.gradients) if self.keep_gradients else None
        empty = self.objective.empty_warning() if self.objective is not None else None
        if empty is not None:
            self.warnings.add(empty)
        return Result("guided-backprop", options, payload, self.warnings.to_list(), record=record,
                      render_text=lambda r: render.render_text(r.to_dict()),
                      render_rich=lambda r: render.render_rich(r.to_dict()))

    def draw(self, item: ImageItem, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import saliency as render

        if item.data is None:
            return item.entry.get("files", {})
        x, grads, ggc = item.data
        entry, cats = item.entry, self.prep.categories
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
            elif sink.out is not None and not self.save_raw:
                self.warnings.add("the input is not an image (C, H, W); no PNGs written (use --save-raw for .npy)")
            if sink.out is not None and self.save_raw:
                files["raw"] = sink.npy(f"{base}/guided.{tag}.npy", g.numpy())
                if ggc is not None:
                    files["guided_gradcam_raw"] = sink.npy(f"{base}/guided_gradcam.{tag}.npy", ggc[k].numpy())
            m["files"] = files
            if panels:
                label = f"{cls} {m['target']['label']}" if m["target"]["label"] else str(cls)
                rows.append((f"{label} ({m['target']['score']:.3g})", panels))
        out: dict[str, Any] = {}
        if sink.out is not None and self.overview and rows:
            pre = self.prep.plan.preprocess
            mean = pre.mean if pre is not None else None
            std = pre.std if pre is not None else None
            fig = render.overview_figure(render.input_image(x, mean, std), rows)
            out["overview"] = sink.figure(f"{base}/overview.png", fig)
        return out


class _GuidedRecord:
    """What the API result adds for Python users: the raw gradients."""

    def __init__(self, parts: list[Any]) -> None:
        import torch

        self.gradients = torch.cat(parts) if parts else None  # (N, K, C, H, W)


def _merge_sanity(acc: dict[str, Any] | None, san: Any) -> dict[str, Any]:
    if acc is None:
        acc = {"layers": san.layers, "seed": san.seed,
               "steps": [{"randomized": s.randomized, "down_to": s.down_to, "spearman": [], "spearman_abs": []}
                         for s in san.steps]}
    for dst, s in zip(acc["steps"], san.steps):
        dst["spearman"].extend(s.spearman)
        dst["spearman_abs"].extend(s.spearman_abs)
    return acc


def _finish_sanity(acc: dict[str, Any] | None) -> dict[str, Any] | None:
    if acc is None:
        return None

    def mean(v: list[float]) -> float | None:
        ok = [x for x in v if not math.isnan(x)]
        return sum(ok) / len(ok) if ok else None

    for s in acc["steps"]:
        s["spearman_mean"] = mean(s["spearman"])
        s["spearman_abs_mean"] = mean(s["spearman_abs"])
    acc["method"] = "cascading randomisation from the top (Adebayo et al. 2018)"
    return acc


def guided_backprop(model: Any, images: Any = None, target: str = "predicted", *, activations: bool = False,
                    guided_gradcam: bool = False, layer: str = "auto", sanity: bool = False,
                    output_key: str | None = None, save_raw: bool = False, overview: bool = True,
                    model_options: ModelOptions | None = None, inputs: InputOptions | None = None,
                    output_dir: Any = None, force: bool = False, tensorboard: Any = None, keep: bool | None = None,
                    on_item: Any = None, notes: Any = None, progress: Any = None,
                    score_threshold: float | None = None, max_detections: int = 10) -> Result:
    """Guided backpropagation of ``images`` (paths or a tensor (N, C, H, W)). The result has
    ``gradients`` (N, K, C, H, W) when kept (the API default), ``to_dict()`` and ``save(dir)``."""
    check_guided_request(layer=layer, guided_gradcam=guided_gradcam, output_key=output_key)
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    prep = prepare("guided-backprop", mopts, inputs, hooks=False, notes=notes)
    keep = output_dir is None if keep is None else keep
    session = GuidedSession(prep, mopts, target=target, activations=activations, guided_gradcam=guided_gradcam,
                            layer=layer, sanity=sanity, output_key=output_key, save_raw=save_raw,
                            overview=overview, keep_gradients=keep, progress=progress,
                            score_threshold=score_threshold, max_detections=max_detections)
    total = len(prep.plan.paths) if prep.plan.paths else 0
    return execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir, force=force,
                   keep=keep, tensorboard=tensorboard, on_item=on_item)
