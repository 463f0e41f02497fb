"""``guided-backprop``: guided backpropagation maps per image and target, as a session.

Files (drawn by :mod:`inspect_model.render.draw_saliency`): per image and target the guided
map, its magnitude, with ``guided_gradcam`` guided Grad-CAM, and ``overview.png``.
Resumable and mergeable: one entry per image, the sanity check's per-image correlations.
"""

from __future__ import annotations

from inspect_model.methods.guided import correlations
from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.run import option_groups as og
from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run.request import MAX_DETECTIONS_HELP, SCORE_THRESHOLD_HELP, Request, api_command, option
from inspect_model.run.objective_options import one_target
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import InputError, UsageError
from inspect_model.registry import command
from inspect_model.reports.guided_backprop import GuidedBackpropReport
from inspect_model.render import html_columns, results


@dataclass(frozen=True)
class GuidedRequest(Request):
    """The options of ``guided-backprop``; validated once, here."""

    command: ClassVar[str] = "guided-backprop"

    target: str | tuple[str, ...] | None = og.target()
    activations: bool = option(False, "--activations", help="Also guide relu6, leaky_relu, silu, gelu and prelu "
                               "(clamp the negative gradient at their outputs).")
    guided_gradcam: bool = option(False, "--guided-gradcam", help="Also write guided backprop times the Grad-CAM "
                                  "map of --layer.")
    layer: str = option("auto", "--layer", "--layers", "-l", help="Grad-CAM layer for --guided-gradcam: auto or a "
                        "layer spec.", complete="layer")
    sanity: bool = option(False, "--sanity", help="Cascading weight-randomisation check (Adebayo et al. 2018) on "
                          "a copy of the model; reports Spearman rank correlation with the original maps.")
    output_key: str | None = og.output_key()
    save_raw: bool = og.save_raw()
    overview: bool = option(True, "--overview/--no-overview", help="With --output-dir: one titled overview PNG "
                            "per image.")
    score_threshold: float | None = option(None, "--score-threshold", type=float, help=SCORE_THRESHOLD_HELP)
    max_detections: int = option(10, "--max-detections", help=MAX_DETECTIONS_HELP)

    def validate(self) -> None:
        from inspect_model.methods.objectives.scores import check_dense_options

        check_dense_options(self.score_threshold, self.max_detections)
        if self.layer != "auto" and not self.guided_gradcam:
            raise UsageError("--layer applies to --guided-gradcam; add --guided-gradcam or drop --layer")
        if self.guided_gradcam and self.output_key is not None:
            raise UsageError("--guided-gradcam uses the model's first output; drop --output-key")


class GuidedSession(Session):
    command = "guided-backprop"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, request: GuidedRequest, *, keep_gradients: bool = False,
                 progress: Any = None) -> None:
        from inspect_model.methods.guided import backprop as gb
        from inspect_model.methods.objectives.scores import task_objective
        from inspect_model.methods.objectives.targets import parse_target

        r = self.request = request
        activations, guided_gradcam, layer, sanity = r.activations, r.guided_gradcam, r.layer, r.sanity
        output_key, save_raw, overview = r.output_key, r.save_raw, r.overview
        self.prep, self.mopts = prep, mopts
        # A detector's or segmenter's scores (issue 24); None for a classifier.
        self.objective = task_objective(prep.loaded, one_target(prep, r.target), prep.categories,
                                        score_threshold=r.score_threshold,
                                        max_detections=r.max_detections, refuse={"--sanity": sanity})
        self.spec = parse_target(r.target, prep.categories) if self.objective is None else self.objective.spec
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
        from inspect_model.render.draw_saliency import GuidedDrawer

        self.drawer = GuidedDrawer(categories=prep.categories, preprocess=prep.plan.preprocess, save_raw=save_raw,
                                   overview=overview, warn=self.warn)

    def warn(self, text: str) -> None:
        self.warnings.add(text)

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.guided import backprop as gb
        from inspect_model.methods.objectives.targets import top_k_warning

        model, x, cats = self.prep.loaded.model, batch.tensor, self.prep.categories
        from inspect_model.methods.objectives.targets import for_batch

        spec = for_batch(self.spec, self.index_base + len(self.entries), int(x.shape[0]))
        if self.objective is not None:  # a detector's or segmenter's scores (issue 24)
            from inspect_model.methods.guided.dense import dense_guided

            res = dense_guided(model, x, self.objective, self.kinds)
        else:
            res = gb.guided_backprop(model, x, spec, activations=self.kinds, output_key=self.output_key,
                                     categories=cats)
        self.warnings.extend(res.warnings)
        if self.objective is not None:
            from inspect_model.methods.objectives.scores import Selection

            self.objective.note_empty(model, x, Selection(None, res.rows or []), batch.names)
        elif not self.entries:  # the class count is the same for every batch: say it once
            cut = top_k_warning(self.spec, res.classes)
            if cut:
                self.warnings.add(cut)
        if self.sites is None:
            self.sites, self.unguided = res.sites, res.unguided
        ggc = None
        if self.guided_gradcam:
            from inspect_model.methods.cam import maps as cam

            if self.objective is not None:  # the dense task's own Grad-CAM of the same rows
                from inspect_model.methods.guided.dense import dense_gradcam

                self.cam_layer, maps = dense_gradcam(model, x, self.objective, self.layer, res)
            else:
                if self.cam_layer is None:
                    self.cam_layer = cam.resolve_layer(model, self.layer, x[:1])
                maps = cam.gradcam(model, x, self.cam_layer, res.targets).detach().float().cpu()
            ggc = gb.guided_gradcam(res.gradients, maps)
        if self.sanity:
            self.sanity_acc = _merge_sanity(self.sanity_acc, gb.sanity_check(
                model, x, res, seed=self.prep.plan.seed, output_key=self.output_key, progress=self.progress))
        if self.keep_gradients:
            self.gradients.append(res.gradients)
        items = []
        for i in range(x.shape[0]):
            frame = self._frame(batch, i) if res.rows is not None else None
            entry = self._entry(self.index_base + len(self.entries), batch.names[i], res, i, frame)
            text = getattr(batch, "text", None)
            if text is not None:  # token maps: the text and its tokens (issue 42)
                entry["text"] = {"text": text.texts[i], "tokens": text.tokens[i]}
            self.entries.append(entry)
            items.append(ImageItem(entry, (x[i].detach().float().cpu(), res.gradients[i],
                                           None if ggc is None else ggc[i])))
        return items

    def _frame(self, batch: Any, i: int) -> Any:
        """Where sample ``i``'s input lies on its picture (None for a tensor input): a
        detection's ``image_box``."""
        from inspect_model.loading.geometry import picture_frame

        img = batch.images[i].image if batch.images is not None else None
        return picture_frame(self.prep.plan.preprocess, img, (int(batch.tensor.shape[-2]), int(batch.tensor.shape[-1])))

    def _entry(self, index: int, name: str, res: Any, i: int, frame: Any = None) -> dict[str, Any]:
        from inspect_model.methods.objectives.rows import target_fields

        maps = []
        for k, cls in enumerate(res.targets[i]):
            g = res.gradients[i, k]
            a = g.abs()
            maps.append({
                "rank": k,
                "target": {**target_fields(cls, self.prep.categories), "score": res.scores[i][k],
                           "probability": res.probabilities[i][k] if res.probabilities else None},
                "max_abs": float(a.max()), "mean_abs": float(a.mean()),
                "nonzero_fraction": float((g != 0).float().mean()), "files": {},
            })
            if res.rows is not None:  # the detection or segmentation target this map explains
                row = [r for r in res.rows if r.sample == i][k]
                maps[-1][self.objective.task] = row.record(frame)
        return {"index": index, "image": name, "targets": [int(t) for t in res.targets[i]], "maps": maps,
                "files": {}}

    def finish(self) -> Result:
        from inspect_model.methods.guided import backprop as gb

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
        record = _GuidedRecord(self.gradients) if self.keep_gradients else None
        empty = self.objective.empty_warning() if self.objective is not None else None
        if empty is not None:
            self.warnings.add(empty)
        return Result("guided-backprop", self.resolved_options(), payload, self.warnings.to_list(), record=record)

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(
            self.mopts, layers=[self.cam_layer] if self.cam_layer else [],
            target=list(self.request.target) if isinstance(self.request.target, tuple) else self.request.target,
            activations=list(self.kinds), guided_gradcam=self.guided_gradcam, sanity=self.sanity,
            output_key=self.output_key, save_raw=self.save_raw, overview=self.overview,
            score_threshold=self.request.score_threshold, max_detections=self.request.max_detections)

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "warnings": self.warnings, "sanity_acc": self.sanity_acc,
                "cam_layer": self.cam_layer, "sites": self.sites, "unguided": self.unguided}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = list(state["entries"])
        self.warnings = state["warnings"]
        self.sanity_acc, self.cam_layer = state["sanity_acc"], state["cam_layer"]
        self.sites, self.unguided = state["sites"], state["unguided"]

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.entries = [e for st in states for e in st["entries"]]
        self.warnings.merge(st["warnings"] for st in states[1:])
        first = next((st for st in states if st["sites"] is not None), None)  # the same on every rank that ran
        if self.sites is None and first is not None:
            self.sites, self.unguided, self.cam_layer = first["sites"], first["unguided"], first["cam_layer"]
        accs = [st["sanity_acc"] for st in states if st["sanity_acc"]]
        if accs:  # --sanity: per-image correlations, concatenated in rank order
            merged = accs[0]
            for acc in accs[1:]:
                for dst, src in zip(merged["steps"], acc["steps"]):
                    correlations.extend(dst, src)
            self.sanity_acc = merged

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
        correlations.extend(dst, {"spearman": s.spearman, "spearman_abs": s.spearman_abs})
    return acc


def _finish_sanity(acc: dict[str, Any] | None) -> dict[str, Any] | None:
    if acc is None:
        return None
    for s in acc["steps"]:
        correlations.add_means(s)
    acc["method"] = correlations.METHOD
    return acc


@command(
    "guided-backprop",
    usage="guided-backprop MODEL IMAGE...",
    order=50,
    summary="guided backpropagation (Springenberg et al. 2015) for any ReLU network",
    help=("Guided backpropagation (Springenberg et al. 2015) for any network.\n\nEvery ReLU of "
          "the model (modules, in-place ones, reused ones, and functional F.relu / torch.relu "
          "calls) passes back only positive gradient where its input was positive. One map per "
          "image and target: a display PNG, a grayscale magnitude PNG, and with --save-raw the "
          "raw gradient (.npy)."),
    example="inspect-model guided-backprop resnet50 cat.jpg --target top:3 --output-dir gb",
    renderer=results.guided_report,
    tables=html_columns.guided_tables,
    schema="guided-backprop.json",
    report=GuidedBackpropReport,
    hooks=False,
    gradients=True,
    scores=True,
    objective=True,
    resumable=True,
    text=True,
)
@api_command(GuidedRequest, positional=("target",))
def guided_backprop(model: Any, images: Any, request: GuidedRequest, call: Call) -> Result:
    """Guided backpropagation of ``images`` (paths or a tensor (N, C, H, W)), with the options
    of :class:`GuidedRequest` (``target`` may come third, positionally: an int, a class name,
    ``"top:K"``, a per-sample list or a 1-D tensor). The result has ``gradients``
    (N, K, C, H, W) when kept (the API default), ``to_dict()`` and ``save(dir)``."""
    return call.run_images("guided-backprop", model, images, request, lambda prep, mopts, keep: GuidedSession(
        prep, mopts, request, keep_gradients=keep, progress=call.progress))
