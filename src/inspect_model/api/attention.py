"""``attention``: what a vision transformer attends to, as a session.

Files per image (``images/NNNN-stem/``): ``<method>.<class>.png`` (rollout, grad-rollout,
LeGrad over the image), ``raw.<layer>.png`` (the chosen query's attention per head on the
patch grid), with ``mosaic`` ``mosaic.png`` (every layer by every head), with ``save_raw``
the maps as ``.npy``.
"""

from __future__ import annotations

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
from inspect_model.errors import InputError


class AttentionSession(Session):
    command = "attention"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, options: Any, *, target: str = "predicted",
                 colormap: str = "jet", save_raw: bool = False, keep_maps: bool = False,
                 evaluate: dict[str, Any] | None = None, notes: Any = None, progress: Any = None) -> None:
        from inspect_model.methods.targets import parse_target

        self.prep, self.mopts, self.options = prep, mopts, options
        self.target_text = target
        self.spec = parse_target(target, prep.categories)
        self.colormap, self.save_raw, self.keep_maps = colormap, save_raw, keep_maps
        # The request as plain values: the --resume fingerprint reads them.
        self.request = {"methods": list(options.methods), "layers": list(options.layers), "heads": options.heads,
                        "query": options.query, "head_fusion": options.head_fusion,
                        "discard_ratio": options.discard_ratio, "mosaic": options.mosaic}
        self.entries: list[dict[str, Any]] = []
        self.maps: list[Any] = []
        self.info: dict[str, Any] | None = None
        self.warnings = Warnings()
        self.eval_options = dict(evaluate or {"evaluate": False})
        self.evaluator = None
        if self.eval_options.get("evaluate"):
            from inspect_model.api.cam_evaluate import Evaluator, check_evaluate_request

            ev = self.eval_options
            parsed = check_evaluate_request(evaluate=True, metrics=ev.get("metrics"), boxes=ev.get("boxes"),
                                            steps=ev["eval_steps"], batch=ev["eval_batch"])
            self.eval_options["metrics"] = parsed
            self.evaluator = Evaluator(prep, parsed, steps=ev["eval_steps"], batch=ev["eval_batch"],
                                       boxes=ev.get("boxes"), notes=notes, progress=progress)

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.attention import compute_attention

        x = batch.tensor
        res = compute_attention(self.prep.loaded.model, x, self.options, target=self.spec)
        if self.info is None:
            self.info = {"layers": res.layers, "heads": res.heads, "tokens": res.tokens, "prefix_tokens": res.prefix,
                         "grid": list(res.grid), "windowed": bool(res.windowed),
                         "passes_per_batch": dict(res.passes)}
        if self.keep_maps:
            self.maps.append(res)
        items = []
        for i in range(x.shape[0]):
            entry = self._entry(self.index_base + len(self.entries), batch.names[i], res, i)
            self.entries.append(entry)
            img = batch.images[i] if batch.images is not None else None
            items.append(ImageItem(entry, (img, x[i].detach().float().cpu(), res, i)))
        if self.evaluator is not None and any(m != "raw" for m in self.options.methods):
            if res.targets is None:
                raise InputError("--evaluate needs class scores: the model's output is no (N, classes) tensor")
            self.evaluator.feed(_EvalView(res), batch, [_scored(it.entry) for it in items])
        return items

    def _entry(self, index: int, name: str, res: Any, i: int) -> dict[str, Any]:
        from inspect_model.render.cam_report import class_name

        target = None
        if res.targets is not None and res.scores is not None:
            cls = int(res.targets[i])
            prob = float(res.scores[i].softmax(0)[cls])
            target = {"class": cls, "label": class_name(cls, self.prep.categories), "probability": prob}
        maps: list[dict[str, Any]] = []
        for method, m in res.maps.items():
            a = m[i]
            if float(a.max()) == float(a.min()):
                self.warnings.add(f"{method}: the map of {name} is constant ({float(a.max()):.3g}): nothing to "
                                  "show; a gradient map is flat when the class score does not depend on the input "
                                  "(torchvision starts ViT's head at zero, so with --weights none every score is 0)")
            r, c = divmod(int(a.argmax()), a.shape[1])
            layer = "+".join(self.options.layers) if method == "legrad" and self.options.layers else "all"
            maps.append({"method": method, "layer": layer, "target": target, "rank": 0, "peak_cell": [r, c],
                         "max": float(a.max()), "min": float(a.min()), "files": {}})
        for layer, v in res.raw.items():
            maps.append({"method": "raw", "layer": layer, "target": None, "heads": res.head_labels[layer],
                         "query": "mean (over each window)" if layer in res.windowed else self.options.query,
                         "grid": list(v.shape[-2:]), "max": float(v[i].max()), "min": float(v[i].min()),
                         "files": {}})
        return {"index": index, "image": name, "target": target, "maps": maps, "files": {}}

    def finish(self) -> Result:
        from inspect_model.render import attention as render

        skipped = input_outcome(self.prep.plan, self.warnings)
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        o = self.options
        payload = {"model": self.prep.loaded.name, "methods": list(o.methods), **(self.info or {}),
                   "images": self.entries, "image_count": len(self.entries), "skipped": skipped}
        if self.evaluator is not None:
            columns = list(dict.fromkeys((m["method"], m["layer"]) for e in self.entries for m in e["maps"]
                                         if m["method"] != "raw"))
            payload["evaluation"] = self.evaluator.summary(self.entries, columns)
        options = self.prep.options(
            self.mopts, methods=list(o.methods), layers=list(o.layers), heads=o.heads, query=o.query,
            head_fusion=o.head_fusion, discard_ratio=o.discard_ratio, mosaic=o.mosaic, target=self.target_text,
            colormap=self.colormap, save_raw=self.save_raw, **self.eval_options)
        record = _AttentionRecord(self.maps) if self.keep_maps else None
        return Result("attention", options, payload, self.warnings.to_list(), record=record,
                      render_text=lambda r: render.report_text(r.to_dict()),
                      render_rich=lambda r: [render.report_text(r.to_dict())])

    def draw(self, item: ImageItem, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import attention as ra
        from inspect_model.render import overlay as ov
        from inspect_model.render.files import safe_name

        if item.data is None or sink.out is None:
            return item.entry.get("files", {})
        img, x, res, i = item.data
        entry, pre = item.entry, self.prep.plan.preprocess
        if img is not None:
            picture, box = ov.viewable(img.image, pre.uncrop_box(*img.image.size) if pre is not None else None)
        else:
            picture, box = ov.input_picture(x), None
        base = image_dir(entry["index"], entry["image"])
        t = entry["target"]
        what = f"class {t['class']}{' ' + t['label'] if t['label'] else ''} (p={t['probability']:.3f})" if t else ""
        tag = class_tag(t["class"], self.prep.categories) if t else "all"
        for rec in entry["maps"]:
            method, layer = rec["method"], rec["layer"]
            if method != "raw":
                m = res.maps[method][i].numpy()
                fig = ra.method_overlay(picture, m, res.input_hw, [f"{method}: {entry['image']}", what], box=box,
                                        cmap=self.colormap)
                rec["files"]["overlay"] = sink.image(f"{base}/{method}.{tag}.png", fig)
            else:
                m = res.raw[layer][i].numpy()
                what = ("attention received, mean over each window's queries" if layer in res.windowed
                        else f"attention of query {self.options.query}")
                fig = ra.head_grid(m, res.head_labels[layer], [
                    f"{layer}", f"{what}, {m.shape[-2]}x{m.shape[-1]} tokens: {entry['image']}"])
                rec["files"]["grid"] = sink.image(f"{base}/raw.{safe_name(layer)}.png", fig)
            if self.save_raw:
                stem = f"{base}/{method}.{tag}" if method != "raw" else f"{base}/raw.{safe_name(layer)}"
                rec["files"]["raw"] = sink.npy(f"{stem}.npy", m)
        out: dict[str, Any] = {}
        if res.mosaic is not None:
            fig = ra.mosaic(res.mosaic[i].numpy(), res.layers,
                            [f"attention of query {self.options.query}, every layer by every head", entry["image"]])
            out["mosaic"] = sink.image(f"{base}/mosaic.png", fig)
        return out


class _EvalView:
    """An attention batch as ``cam --evaluate`` reads a cam batch: maps at the input's size in
    [0, 1], one per image and method, and the class probabilities."""

    def __init__(self, res: Any) -> None:
        from types import SimpleNamespace

        import torch

        from inspect_model.render.attention import normalise, upsample

        self.probabilities = res.scores.softmax(dim=1)
        self.maps = [SimpleNamespace(sample=i, target=int(res.targets[i]),
                                     map=torch.from_numpy(upsample(normalise(m[i].numpy()), res.input_hw).copy()))
                     for i in range(len(res.targets)) for m in res.maps.values()]


def _scored(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as the evaluator sees it: its method maps (the same records, scored in place)."""
    return {"index": entry["index"], "image": entry["image"], "maps": [m for m in entry["maps"] if m["method"] != "raw"]}


class _AttentionRecord:
    """What the API result adds for Python users: the maps as tensors."""

    def __init__(self, parts: list[Any]) -> None:
        import torch

        self.maps = {k: torch.cat([p.maps[k] for p in parts]) for k in (parts[0].maps if parts else {})}
        self.raw = {k: torch.cat([p.raw[k] for p in parts]) for k in (parts[0].raw if parts else {})}
        self.grid = parts[0].grid if parts else None


def attention(model: Any, images: Any = None, methods: Any = ("rollout",), *, layers: Any = (),
              heads: str = "mean", query: str = "cls", head_fusion: str = "mean", discard_ratio: float = 0.0,
              mosaic: bool = False, target: Any = "predicted", colormap: str = "jet", save_raw: bool = False,
              evaluate: bool = False, metrics: list[str] | None = None, boxes: Any = None, eval_steps: int = 32,
              eval_batch: int = 64,
              model_options: ModelOptions | None = None, inputs: InputOptions | None = None,
              output_dir: Any = None, force: bool = False, tensorboard: Any = None, keep: bool | None = None,
              on_item: Any = None, notes: Any = None, progress: Any = None) -> Result:
    """Attention maps of ``images`` (paths or a tensor (N, C, H, W)) for a vision transformer:
    ``raw``, ``rollout``, ``grad-rollout``, ``legrad`` (see ``methods.attention``). The result
    has ``maps`` (method -> (N, rows, cols)) and ``raw`` (layer -> (N, heads, rows, cols))
    when kept (the API default), ``to_dict()`` and ``save(dir)``."""
    from inspect_model.methods.attention import AttentionOptions
    from inspect_model.render.overlay import check_colormap

    if isinstance(layers, str):
        layers = [layers]
    opts = AttentionOptions(methods=methods if not isinstance(methods, str) else (methods,),
                            layers=tuple(str(s) for s in layers), heads=heads, query=query,
                            head_fusion=head_fusion, discard_ratio=discard_ratio, mosaic=mosaic)
    check_colormap(colormap)
    from inspect_model.api.cam_evaluate import check_evaluate_request

    check_evaluate_request(evaluate=evaluate, metrics=metrics, boxes=boxes, steps=eval_steps, batch=eval_batch)
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    prep = prepare("attention", mopts, inputs, hooks=True, notes=notes)
    keep = output_dir is None if keep is None else keep
    ev = {"evaluate": evaluate, "metrics": metrics, "boxes": str(boxes) if boxes else None, "eval_steps": eval_steps,
          "eval_batch": eval_batch}
    session = AttentionSession(prep, mopts, opts, target=str(target), colormap=colormap, save_raw=save_raw,
                               keep_maps=keep, evaluate=ev if evaluate else None, notes=notes, progress=progress)
    total = len(prep.plan.paths) if prep.plan.paths else 0
    return execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir, force=force,
                   keep=keep, tensorboard=tensorboard, on_item=on_item)
