"""``cam``: class activation maps per image, target, method and layer, as a session.

Files (drawn by :mod:`inspect_model.render.draw_cam`): per image and map an overlay and a
heat map, contact sheets at the top. Resumable and mergeable: one entry per image, pass counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run import option_groups as og
from inspect_model.run.option_groups import Evaluate, Layers, Picture
from inspect_model.run.request import (
    MAX_DETECTIONS_HELP,
    SCORE_THRESHOLD_HELP,
    Request,
    api_command,
    option,
    positive,
)
from inspect_model.run.resume import count
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import InputError, UsageError
from inspect_model.methods.cam.base import method_help
from inspect_model.methods.cam.base import names as cam_names
from inspect_model.registry import command
from inspect_model.reports.cam import CamReport
from inspect_model.render import html_columns, results


@dataclass(frozen=True)
class CamRequest(Request):
    """The options of ``cam`` (see README "cam"); validated once, here."""

    command: ClassVar[str] = "cam"
    groups: ClassVar[tuple[Any, ...]] = (Evaluate, Picture, Layers)

    methods: tuple[str, ...] = option(("gradcam",), "--method", "-m", help=method_help, multiple=True,
                                      param="method", complete="method")
    layers: tuple[str, ...] = og.layers(help="auto (last spatial layer; ViT/Swin: last block as a patch grid) "
                                            "or a layer spec; repeat for one map per layer.", param="layer")
    reshape: str | None = option(None, "--reshape", type=str, help="Patch grid HxW for a token layer (N, tokens, "
                                 "D); leading class/register tokens are dropped.")
    fuse: bool = option(False, "--fuse", help="With several --layer: also a fused map (element-wise max of the "
                        "normalised maps).")
    target: str | tuple[str, ...] | None = og.target()
    output_key: str | None = og.output_key()
    scorecam_batch: int | None = option(None, "--scorecam-batch", type=int, help="Masked inputs per forward pass "
                                        "for scorecam (across images and channels). Default: the largest that fits "
                                        "the memory budget (half the free GPU memory, 1 GiB on a CPU).")
    colormap: str = og.colormap("jet")
    alpha: float = option(0.5, "--alpha", help="Heat-map opacity in overlays, 0..1.")
    top: int = option(5, "--top", help="Predicted classes listed per image.")
    save_raw: bool = og.save_raw()
    evaluate: bool = og.evaluate()
    metrics: tuple[str, ...] = og.metrics()
    boxes: Any = option(None, "--boxes", type=Path, help="JSON or CSV of boxes image,x0,y0,x1,y1[,label] in "
                        "original-image pixels: with --evaluate for the pointing and energy games; for a detector "
                        "the boxes to explain, for a segmenter the region of the mask; for a flow model the region "
                        "whose mean flow magnitude is explained.")
    eval_steps: int | str = og.eval_steps()
    eval_tolerance: float = og.eval_tolerance()
    eval_batch: int | None = og.eval_batch()
    score_threshold: float | None = option(None, "--score-threshold", type=float, help=SCORE_THRESHOLD_HELP)
    max_detections: int = option(10, "--max-detections", help=MAX_DETECTIONS_HELP)

    def evaluation_boxes(self) -> Any:
        return self.boxes

    def validate(self) -> None:  # target, colormap, layer specs and --evaluate are checked by their groups
        from inspect_model.methods.cam.maps import parse_methods, parse_reshape
        from inspect_model.methods.objectives.scores import check_dense_options

        if not 0.0 <= self.alpha <= 1.0:
            raise UsageError(f"--alpha must be between 0 and 1, got {self.alpha}")
        positive(self.scorecam_batch, "--scorecam-batch")
        positive(self.top, "--top")
        self._set("parsed_methods", tuple(parse_methods(list(self.methods or ("gradcam",)))))
        self._set("grid", parse_reshape(self.reshape))
        if self.fuse and len(self.layers) < 2:
            raise UsageError("--fuse combines several layers; give --layer at least twice")
        check_dense_options(self.score_threshold, self.max_detections)


def check_cam_request(**options: Any) -> CamRequest:
    """The cam options that need no model, checked before anything loads (as the request)."""
    return CamRequest(**options)


class CamSession(Session):
    """Feed batches; each image gives its predictions and maps (see the module docstring)."""

    command = "cam"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, request: CamRequest, *, notes: Any = None,
                 progress: Any = None) -> None:
        from inspect_model.api.cam.tasks import DenseCam, dense_task
        from inspect_model.methods.objectives.targets import parse_target

        r = self.request = request
        self.method_items = list(r.methods or ("gradcam",))  # as typed: `all` makes CAM optional
        self.methods, self.reshape = list(r.parsed_methods), r.grid
        self.prep, self.mopts, self.layer_specs = prep, mopts, list(r.layers)
        self.fuse, self.output_key, self.scorecam_batch = r.fuse, r.output_key, r.scorecam_batch
        self.colormap, self.alpha, self.top, self.save_raw = r.colormap, r.alpha, r.top, r.save_raw
        self.notes = notes or (lambda text: None)
        self.progress = progress  # progress(done, total, label) for the long inner loops
        self.warnings = Warnings()
        task = dense_task(prep)  # detection / segmentation: maps of detections and masks (issue 24)
        self.dense = None if task == "classification" else DenseCam(self, task, r)
        self.spec = parse_target(r.target, prep.categories) if self.dense is None else self.dense.objective.spec
        self.cam_layers: list[Any] | None = None
        self.entries: list[dict[str, Any]] = []
        self.passes = {"forward": 0, "backward": 0, "scorecam_forward": 0}
        self.columns: list[tuple[str, str]] = []
        ev = r.evaluation  # --evaluate and its options, parsed once (run/option_groups.Evaluate)
        self.eval_options = {"evaluate": ev.enabled, "metrics": list(ev.metrics) or None,
                             "boxes": str(r.boxes) if r.boxes else None, "eval_steps": ev.steps,
                             "eval_batch": ev.batch, "eval_tolerance": ev.tolerance}
        self.evaluator: Any = None
        flow = hasattr(prep.binding, "second_for")
        if flow and ("scorecam" in self.methods or ev.enabled):
            raise UsageError("Score-CAM and --evaluate perturb the input, and a flow model's input is a pair of "
                             "images; use the gradient methods (gradcam, ...) or eigencam")
        if r.boxes is not None and not ev.enabled and self.dense is None:
            if not flow:
                raise UsageError("--boxes needs --evaluate (for a classifier; a detector or a segmenter takes "
                                 "--boxes as the boxes to explain, a flow model as the region to explain)")
            from inspect_model.run.media import flow_boxes

            flow_boxes(prep, r.boxes, self.notes)  # a flow model: the region whose flow is explained
        self.evaluator = r.evaluation.evaluator(prep, boxes=r.boxes, output_key=r.output_key, notes=self.notes,
                                                progress=progress)
        from inspect_model.render.draw_cam import CamDrawer

        self.drawer = CamDrawer(categories=prep.categories, preprocess=prep.plan.preprocess, alpha=r.alpha,
                                colormap=r.colormap, save_raw=r.save_raw, curves=self.evaluator is not None,
                                task=task)

    # ------------------------------------------------------------------ computing
    def _resolve(self, x: Any) -> None:
        from inspect_model.methods.cam.maps import resolve_layers

        net = self.prep.loaded.model
        self.cam_layers = resolve_layers(net, x, self.layer_specs or None, self.reshape, self.output_key,
                                         probe=getattr(self.prep.loaded, "static_batch", None) or 1,
                                         declared=getattr(self.prep.loaded, "cam_layer", None))
        for lay in self.cam_layers:
            g = lay.layout.grid
            self.notes(f"layer: {lay.name} ({lay.layout.kind}, {'x'.join(map(str, g))} grid, "
                       f"{lay.layout.channels} channels)")
        if "scorecam" in self.methods:
            plan = self.prep.plan
            from inspect_model.run.runner import units

            n_images = len(units(plan)) or int(x.shape[0])  # images, or clips or frame pairs
            per = sum(lay.layout.channels for lay in self.cam_layers)
            from inspect_model.methods.cam.passes import scorecam_batch_size

            size = scorecam_batch_size(x, per * n_images, self.scorecam_batch)
            how = "--scorecam-batch" if self.scorecam_batch else "the memory budget; --scorecam-batch to set"
            self.notes(f"scorecam: {per} masked inputs per image ({n_images} image(s): {per * n_images} in all; "
                       f"channels with equal normalised maps share one, constant ones the zero input), "
                       f"in forward passes of up to {size} across images and channels ({how})")
        names = [lay.name for lay in self.cam_layers]
        if self.fuse and len(names) > 1:
            names.append("fused:" + "+".join(names))
        self.columns = self.drawer.columns = [(m, n) for n in names for m in self.methods]

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.cam.maps import compute_cams

        if self.dense is not None:
            return self.dense.feed(batch)
        if self.cam_layers is None:
            self._resolve(batch.tensor)
        from inspect_model.methods.objectives.targets import for_batch

        start = self.index_base + len(self.entries)
        res = compute_cams(self.prep.loaded.model, batch.tensor, layers=self.cam_layers, methods=self.method_items,
                           target=for_batch(self.spec, start, int(batch.tensor.shape[0])),
                           output_key=self.output_key, scorecam_batch=self.scorecam_batch,
                           fuse=self.fuse, progress=self.progress)
        for key in self.passes:
            self.passes[key] += res.passes[key]
        self.warnings.extend(res.notes)
        if not self.entries:  # the class count is the same for every batch: say it once
            from inspect_model.methods.objectives.targets import top_k_warning

            cut = top_k_warning(self.spec, int(res.probabilities.shape[-1]))
            if cut:
                self.warnings.add(cut)
        items = []
        first = len(self.entries)
        for i in range(batch.tensor.shape[0]):
            index = self.index_base + len(self.entries)
            name = batch.names[i]
            img = batch.images[i] if batch.images is not None else None
            entry = self._entry(res, i, index, name, img)
            self.entries.append(entry)
            maps = [m for m in res.maps if m.sample == i]
            items.append(ImageItem(entry, (img, batch.tensor[i], maps, res.probabilities[i])))
        if self.evaluator is not None:
            self.evaluator.feed(res, batch, self.entries[first:])
        return items

    def _entry(self, res: Any, i: int, index: int, name: str, img: Any) -> dict[str, Any]:
        from inspect_model.methods.cam.entries import image_entry

        for m in res.maps:
            if m.sample == i:
                for w in m.warnings:
                    self.warnings.add(f"{name}: {m.method} at {m.layer} for class {m.target}: {w}")
        size = list(img.image.size) if img is not None else None
        return image_entry(res, i, index=index, name=name, size=size, categories=self.prep.categories,
                           top=self.top).to_dict()

    def finish(self) -> Result:
        plan = self.prep.plan
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        skipped = input_outcome(plan, self.warnings)
        layers = self.cam_layers or []
        payload = {
            "model": self.prep.loaded.name,
            "methods": list(self.methods),
            "layers": [lay.describe() for lay in layers],
            "target": self.spec.text,
            "fuse": bool(self.fuse and len(layers) > 1),
            "images": self.entries,
            "image_count": len(self.entries),
            "passes": dict(self.passes),
            "skipped": skipped,
        }
        if self.dense is not None:
            self.dense.finish(payload)
        if self.evaluator is not None:
            payload["evaluation"] = self.evaluator.summary(self.entries, self.columns)
        return Result("cam", self.resolved_options(), payload, self.warnings.to_list(), record=None)

    def resolved_options(self) -> dict[str, Any]:
        options = self.prep.options(
            self.mopts, layers=[lay.name for lay in self.cam_layers or []], layer_specs=self.layer_specs or ["auto"],
            reshape=list(self.reshape) if self.reshape else None, target=_target_option(self.request.target),
            methods=list(self.methods), fuse=self.fuse, output_key=self.output_key,
            scorecam_batch=self.scorecam_batch, colormap=self.colormap, alpha=self.alpha, top=self.top,
            save_raw=self.save_raw, **self.eval_options, score_threshold=self.request.score_threshold,
            max_detections=self.request.max_detections)
        if self.dense is not None:
            options.update(self.dense.options, boxes=str(self.request.boxes) if self.request.boxes else None)
        return options

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "passes": dict(self.passes), "warnings": self.warnings,
                "cam_layers": self.cam_layers, "columns": list(self.columns), "drawer": self.drawer.state_dict(),
                "dense": None if self.dense is None else self.dense.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = list(state["entries"])
        self.passes = {k: count(state["passes"][k], f"the {k} pass count") for k in self.passes}
        self.warnings = state["warnings"]
        self.cam_layers = state["cam_layers"]
        self.columns = self.drawer.columns = [(str(m), str(n)) for m, n in state["columns"]]
        self.drawer.load_state_dict(state["drawer"])
        if self.dense is not None and state.get("dense"):
            self.dense.load_state_dict(state["dense"])

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.entries = [e for st in states for e in st["entries"]]
        self.passes = {k: sum(st["passes"][k] for st in states) for k in self.passes}
        self.warnings.merge(st["warnings"] for st in states[1:])
        first = next((st for st in states if st["cam_layers"]), None)  # the same on every rank that ran
        if self.cam_layers is None and first is not None:
            self.cam_layers = first["cam_layers"]
            self.columns = self.drawer.columns = [(str(m), str(n)) for m, n in first["columns"]]
        self.drawer.merge([st["drawer"] for st in states])
        if self.dense is not None:
            self.dense.merge([st["dense"] for st in states if st.get("dense")])

@command(
    "cam",
    usage="cam MODEL IMAGE...",
    order=60,
    summary="CAM, Grad-CAM, Grad-CAM++, XGrad-CAM, LayerCAM, HiResCAM, Score-CAM, Eigen-CAM",
    help=("Class activation maps: CAM, Grad-CAM, Grad-CAM++, XGrad-CAM, Layer-CAM, HiResCAM, "
          "Score-CAM and Eigen-CAM.\n\nAll gradient methods come from one forward pass and a "
          "backward pass that stops at the layer. With --output-dir: per image, target, method "
          "and layer a heat-map overlay on the original image, the bare map with a colour bar, "
          "--save-raw .npy maps, and contact sheets. --evaluate scores and ranks the maps "
          "(faithfulness) and plots deletion/insertion curves."),
    example=("inspect-model cam resnet50 cat.jpg --method gradcam --method scorecam --target "
             "top:2 -o cams"),
    renderer=results.cam_report,
    tables=html_columns.cam_tables,
    methods=cam_names,
    method_groups=("all", "gradients"),
    schema="cam.json",
    report=CamReport,
    gradients=True,
    scores=True,
    objective=True,
    resumable=True,
    text=True,
)
@api_command(CamRequest)
def cam(model: Any, images: Any, request: CamRequest, call: Call) -> Result:
    """Class activation maps of ``images`` (paths, or a tensor (N, C, H, W)) under ``model``
    (a spec, an ``nn.Module`` or a ``LoadedModel``), with the options of :class:`CamRequest`
    as keywords (``methods=["gradcam"]``, ``target=3``...). The result's ``to_dict()`` is the
    CLI's ``--json``; ``save(dir)`` (or ``output_dir=``) writes the CLI's files.
    ``evaluate=True`` adds faithfulness scores (see :mod:`inspect_model.run.evaluate`)."""
    return call.run_images("cam", model, images, request, lambda prep, mopts, keep: CamSession(
        prep, mopts, request, notes=call.notes, progress=call.progress))



def _target_option(target: Any) -> Any:
    """A request's target as the report's options record it: its text, or the per-sample list."""
    return list(target) if isinstance(target, tuple) else target
