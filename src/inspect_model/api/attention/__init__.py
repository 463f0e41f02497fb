"""``attention``: what a vision transformer attends to, as a session.

Files per image (``images/NNNN-stem/``): ``<method>.<class>.png`` (rollout, grad-rollout,
LeGrad over the image), ``raw.<layer>.png`` (the chosen query's attention per head on the
patch grid), with ``mosaic`` ``mosaic.png`` (every layer by every head), with ``save_raw``
the maps as ``.npy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from inspect_model.run import option_groups as og
from inspect_model.methods.attention.maps import AttentionOptions
from inspect_model.run.option_groups import Evaluate, Picture
from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run.request import Request, api_command, option
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import InputError, UsageError
from inspect_model.methods.attention.base import method_help as attention_help
from inspect_model.methods.attention.base import map_layer
from inspect_model.methods.attention.base import all_names as attention_names
from inspect_model.registry import command
from inspect_model.reports.attention import AttentionReport
from inspect_model.render import html_columns
from inspect_model.render.attention import render_result


@dataclass(frozen=True)
class AttentionRequest(Request):
    """The options of ``attention``; validated once, here."""

    command: ClassVar[str] = "attention"
    groups: ClassVar[tuple[Any, ...]] = (Evaluate, Picture, AttentionOptions)  # request.attention: the maps' options

    methods: tuple[str, ...] = option(("rollout",), "--method", "-m", help=attention_help, complete="method",
                                   multiple=True, param="method")
    layers: tuple[str, ...] = option((), "--layers", "--layer", "-l", help="Attention layers for raw and legrad: "
                                  "indices (-1 = last), module names or all (default: raw the last, legrad all).",
                                  multiple=True, param="layers")
    heads: str = option("mean", "--heads", help="raw: head indices like 0,3, all, or a fusion: mean, max, min.")
    query: str = option("cls", "--query", help="raw: the query token: cls, mean, last, or a token "
                       "index (text: cls is [CLS], or a decoder's last token).")
    head_fusion: str = option("mean", "--head-fusion", help="rollout: how heads are fused: mean, max, min.")
    discard_ratio: float = option(0.0, "--discard-ratio", help="rollout: the fraction of lowest attentions dropped "
                               "per layer.")
    mosaic: bool = option(False, "--mosaic", help="Also draw every layer by every head (mosaic.png).")
    cam_layer: str = option("auto", "--cam-layer", help="The layer of the CAM methods in --method (auto: the one "
                            "cam picks; for a ViT the last block's first norm on the patch grid).", complete="layer")
    target: str | tuple[str, ...] | None = og.target()
    colormap: str = og.colormap("jet")
    save_raw: bool = og.save_raw()
    evaluate: bool = og.evaluate()
    metrics: tuple[str, ...] = og.metrics()
    boxes: Any = option(None, "--boxes", type=Path, help="With --evaluate: JSON or CSV of boxes image,x0,y0,x1,y1 "
                     "in original-image pixels, for the pointing and energy games.")
    eval_steps: int | str = og.eval_steps()
    eval_tolerance: float = og.eval_tolerance()
    eval_batch: int | None = og.eval_batch()

    def evaluation_boxes(self) -> Any:
        return self.boxes

    def validate(self) -> None:  # target, colormap, --evaluate and the maps' options are checked by their groups
        self._set("methods", self.attention.methods)
        self._set("layers", self.attention.layers)


class AttentionSession(Session):
    command = "attention"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, request: AttentionRequest, *, keep_maps: bool = False,
                 notes: Any = None, progress: Any = None) -> None:
        from inspect_model.methods.objectives.targets import parse_target
        from inspect_model.render.attention import AttentionDrawer

        self.prep, self.mopts, self.request = prep, mopts, request
        self.options = request.attention
        self.skipped_methods = self._score_free(notes)
        self.spec = parse_target(request.target, prep.categories)
        self.keep_maps = keep_maps
        self.entries: list[dict[str, Any]] = []
        self.maps: list[Any] = []
        self.text_maps: list[Any] = []  # --text: methods.attention_text.TextAttention per batch
        self.info: dict[str, Any] | None = None
        self.warnings = Warnings()
        self.cam_layer: Any = None
        self.evaluator = request.evaluation.evaluator(prep, boxes=request.boxes, notes=notes, progress=progress)
        self.drawer = AttentionDrawer(categories=prep.categories, preprocess=prep.plan.preprocess,
                                      colormap=request.colormap, save_raw=request.save_raw, query=request.query)
        # --text, or token ids of a token model: token maps (issue 26); images still drawn as images
        if getattr(prep.plan, "texts", None) is not None or callable(
                getattr(prep.loaded.model, "get_input_embeddings", None)):
            from inspect_model.render.attention_text import TextDrawer

            self.drawer = TextDrawer(self.drawer)

    def _score_free(self, notes: Any) -> dict[str, str]:
        """A head-less model (issue 42): the methods that explain a score are skipped, with a
        note, unless an objective is named; raw attention and rollout run (methods/attention/headless.py)."""
        import dataclasses

        from inspect_model.methods.attention.headless import skipped_note, split_methods

        run, skipped = split_methods(self.options.methods, self.prep.loaded.model,
                                     task=getattr(self.prep, "task", None), target=self.request.target)
        if not skipped:
            return {}
        if not run:
            raise UsageError(f"{skipped_note(skipped)}; raw attention and rollout need no score: -m raw,rollout")
        self.options = dataclasses.replace(self.options, methods=run)
        if notes is not None:
            notes(skipped_note(skipped))
        return skipped

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.attention.maps import cam_methods
        from inspect_model.methods.attention.passes import compute_attention

        from inspect_model.api.attention.text import feed_text, token_batch

        batch = token_batch(batch, self.prep.loaded.model) or batch  # token ids without texts: as texts (issue 42)
        if getattr(batch, "text", None) is not None:  # token ids of texts (issue 26)
            return feed_text(self, batch)
        x = batch.tensor
        if self.cam_layer is None and cam_methods(self.options.methods):  # resolved once, as cam does
            from inspect_model.methods.attention.cam import resolve

            self.cam_layer = resolve(self.prep.loaded.model, x, self.options.cam_layer,
                                     declared=getattr(self.prep.loaded, "cam_layer", None))
        res = compute_attention(self.prep.loaded.model, x, self.options, target=self.spec, cam_layer=self.cam_layer)
        if self.info is None:
            self.info = {"layers": res.layers, "heads": res.heads, "tokens": res.tokens, "prefix_tokens": res.prefix,
                         "grid": list(res.grid), "windowed": bool(res.windowed or res.hierarchical),
                         "cam_layer": res.cam_layer,
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
        from inspect_model.methods.objectives.rows import target_fields

        target = None
        if res.targets is not None and res.scores is not None:
            cls = int(res.targets[i])
            from inspect_model.methods.objectives.targets import class_probabilities

            prob = float(class_probabilities(res.scores[i:i + 1])[0, cls])
            target = {**target_fields(cls, self.prep.categories), "probability": prob}
        maps: list[dict[str, Any]] = []
        for method, m in res.maps.items():
            a = m[i]
            if float(a.max()) == float(a.min()):
                self.warnings.add(f"{method}: the map of {name} is constant ({float(a.max()):.3g}): nothing to "
                                  "show; a gradient map is flat when the class score does not depend on the input "
                                  "(torchvision starts ViT's head at zero, so with --weights none every score is 0)")
            r, c = divmod(int(a.argmax()), a.shape[1])
            layer = map_layer(method, self.options.layers, res.cam_layer)
            maps.append({"method": method, "layer": layer, "target": target, "rank": 0, "peak_cell": [r, c],
                         "max": float(a.max()), "min": float(a.min()), "files": {}})
        for layer, v in res.raw.items():
            maps.append({"method": "raw", "layer": layer, "target": None, "heads": res.head_labels[layer],
                         "query": "mean (over each window)" if layer in res.windowed else self.options.query,
                         "grid": list(v.shape[-2:]), "max": float(v[i].max()), "min": float(v[i].min()),
                         "files": {}})
        return {"index": index, "image": name, "target": target, "maps": maps, "files": {}}

    def finish(self) -> Result:
        skipped = input_outcome(self.prep.plan, self.warnings)
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        payload = {"model": self.prep.loaded.name, "methods": list(self.options.methods), **(self.info or {}),
                   "images": self.entries, "image_count": len(self.entries), "skipped": skipped}
        if self.skipped_methods:
            payload["skipped_methods"] = dict(self.skipped_methods)
        if self.evaluator is not None:
            columns = list(dict.fromkeys((m["method"], m["layer"]) for e in self.entries for m in e["maps"]
                                         if m["method"] != "raw"))
            payload["evaluation"] = self.evaluator.summary(self.entries, columns)
        record = _AttentionRecord(self.maps) if self.keep_maps else None
        if self.keep_maps and self.text_maps:
            from inspect_model.api.attention.text import TextRecord

            record = TextRecord(self.text_maps)
        return Result("attention", self.resolved_options(), payload, self.warnings.to_list(), record=record)

    def resolved_options(self) -> dict[str, Any]:
        r, o, ev = self.request, self.options, self.request.evaluation
        return self.prep.options(
            self.mopts, methods=list(o.methods), layers=list(o.layers), heads=o.heads, query=o.query,
            head_fusion=o.head_fusion, discard_ratio=o.discard_ratio, mosaic=o.mosaic, cam_layer=o.cam_layer,
            target=list(r.target) if isinstance(r.target, tuple) else r.target, colormap=r.colormap,
            save_raw=r.save_raw, evaluate=ev.enabled, metrics=list(ev.metrics),
            boxes=str(r.boxes) if r.boxes else None, eval_steps=ev.steps, eval_batch=ev.batch,
            eval_tolerance=ev.tolerance)

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "warnings": self.warnings, "info": self.info,
                "passes": self.evaluator.passes if self.evaluator is not None else 0,
                "inputs": self.evaluator.inputs if self.evaluator is not None else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries, self.warnings, self.info = list(state["entries"]), state["warnings"], state["info"]
        if self.evaluator is not None:
            self.evaluator.passes, self.evaluator.inputs = state["passes"], state["inputs"]

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.entries = [e for st in states for e in st["entries"]]
        self.warnings.merge(st["warnings"] for st in states[1:])
        if self.info is None:
            self.info = next((st["info"] for st in states if st["info"] is not None), None)
        if self.evaluator is not None:
            self.evaluator.passes = sum(st["passes"] for st in states)
            self.evaluator.inputs = sum(st["inputs"] for st in states)


class _EvalView:
    """An attention batch as ``cam --evaluate`` reads a cam batch: maps at the input's size in
    [0, 1], one per image and method, and the class probabilities."""

    def __init__(self, res: Any) -> None:
        from types import SimpleNamespace

        import torch

        from inspect_model.methods.objectives.targets import class_probabilities
        from inspect_model.render.attention import normalise, upsample

        self.probabilities = class_probabilities(res.scores)
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


@command(
    "attention",
    usage="attention MODEL IMAGE...",
    order=80,
    summary=("attention maps of transformers: raw, rollout, grad-rollout, LeGrad, for any "
             "attention kernel"),
    help=("Attention maps of vision transformers, for any attention kernel (fused SDPA, "
          "nn.MultiheadAttention, eager softmax), with no change to the model.\n\nMethods: raw "
          "attention of chosen layers and heads; rollout (Abnar & Zuidema 2020); grad-rollout "
          "(Chefer et al. 2021); legrad (Bousselham et al. 2024). Files per image: one overlay "
          "per method, one head grid per raw layer, with --mosaic every layer by every head. "
          "--evaluate scores the maps for faithfulness exactly as cam --evaluate does, and ranks "
          "the methods."),
    example=("inspect-model attention vit_b_16 cat.jpg --method rollout,grad-rollout,legrad "
             "--output-dir attn"),
    renderer=render_result,
    tables=html_columns.attention_tables,
    methods=attention_names,
    schema="attention.json",
    report=AttentionReport,
    gradients=True,
    resumable=True,
    text=True,
)
@api_command(AttentionRequest)
def attention(model: Any, images: Any, request: AttentionRequest, call: Call) -> Result:
    """Attention maps of ``images`` (paths or a tensor (N, C, H, W)) for a vision transformer,
    with the options of :class:`AttentionRequest`: ``raw``, ``rollout``, ``grad-rollout``,
    ``legrad`` (see ``methods.attention``). The result has ``maps`` (method -> (N, rows,
    cols)) and ``raw`` (layer -> (N, heads, rows, cols)) when kept (the API default),
    ``to_dict()`` and ``save(dir)``."""
    return call.run_images("attention", model, images, request, lambda prep, mopts, keep: AttentionSession(
        prep, mopts, request, keep_maps=keep, notes=call.notes, progress=call.progress))