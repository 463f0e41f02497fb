"""``cam``: class activation maps per image, target, method and layer, as a session.

Files (drawn by :mod:`inspect_model.render.draw_cam`): per image and map an overlay and a
heat map, contact sheets at the top. Resumable and mergeable: one entry per image, pass counts.
"""

from __future__ import annotations

from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import execute, prepare, tracked
from inspect_model.api.resume import count
from inspect_model.api.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import InputError, UsageError


def check_cam_request(*, methods: list[str] | None, layers: list[str] | None, reshape: str | None, fuse: bool,
                      scorecam_batch: int, colormap: str, alpha: float, top: int) -> tuple[list[str], Any]:
    """The cam options that need no model, checked before anything loads."""
    from inspect_model.methods.cam import parse_methods, parse_reshape

    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"--alpha must be between 0 and 1, got {alpha}")
    if scorecam_batch < 1:
        raise UsageError(f"--scorecam-batch must be 1 or more, got {scorecam_batch}")
    if top < 1:
        raise UsageError(f"--top must be 1 or more, got {top}")
    parsed = parse_methods(methods)
    grid = parse_reshape(reshape)
    if fuse and len(layers or []) < 2:
        raise UsageError("--fuse combines several layers; give --layer at least twice")
    from inspect_model.render.overlay import check_colormap

    check_colormap(colormap)
    return parsed, grid


class CamSession(Session):
    """Feed batches; each image gives its predictions and maps (see the module docstring)."""

    command = "cam"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, *, methods: list[str] | None = None,
                 layers: list[str] | None = None, reshape: str | None = None, fuse: bool = False,
                 target: str = "predicted", output_key: str | None = None, scorecam_batch: int = 32,
                 colormap: str = "jet", alpha: float = 0.5, top: int = 5, save_raw: bool = False,
                 notes: Any = None, evaluate: bool = False, metrics: list[str] | None = None, boxes: Any = None,
                 eval_steps: int = 32, eval_batch: int = 64, progress: Any = None) -> None:
        from inspect_model.methods.targets import parse_target

        self.method_items = list(methods or ["gradcam"])  # as typed: `all` makes CAM optional
        self.methods, self.reshape = check_cam_request(
            methods=self.method_items, layers=layers, reshape=reshape, fuse=fuse, scorecam_batch=scorecam_batch,
            colormap=colormap, alpha=alpha, top=top)
        self.prep, self.mopts, self.layer_specs = prep, mopts, list(layers or [])
        self.fuse, self.output_key, self.scorecam_batch = fuse, output_key, scorecam_batch
        self.colormap, self.alpha, self.top, self.save_raw = colormap, alpha, top, save_raw
        self.target_text = target
        self.spec = parse_target(target, prep.categories)
        self.notes = notes or (lambda text: None)
        self.progress = progress  # progress(done, total, label) for the long inner loops
        self.warnings = Warnings()
        self.cam_layers: list[Any] | None = None
        self.entries: list[dict[str, Any]] = []
        self.passes = {"forward": 0, "backward": 0, "scorecam_forward": 0}
        self.columns: list[tuple[str, str]] = []
        self.eval_options = {"evaluate": evaluate, "metrics": None, "boxes": str(boxes) if boxes else None,
                             "eval_steps": eval_steps, "eval_batch": eval_batch}
        self.evaluator: Any = None
        if evaluate or metrics or boxes:
            from inspect_model.api.cam_evaluate import Evaluator, check_evaluate_request

            parsed = check_evaluate_request(evaluate=evaluate, metrics=metrics, boxes=boxes, steps=eval_steps,
                                            batch=eval_batch)
            self.eval_options["metrics"] = parsed
            self.evaluator = Evaluator(prep, parsed, steps=eval_steps, batch=eval_batch, boxes=boxes,
                                       output_key=output_key, notes=self.notes, progress=progress)
        from inspect_model.render.draw_cam import CamDrawer

        self.drawer = CamDrawer(categories=prep.categories, preprocess=prep.plan.preprocess, alpha=alpha,
                                colormap=colormap, save_raw=save_raw, curves=self.evaluator is not None)

    # ------------------------------------------------------------------ computing
    def _resolve(self, x: Any) -> None:
        from inspect_model.methods.cam import resolve_layers

        net = self.prep.loaded.model
        self.cam_layers = resolve_layers(net, x, self.layer_specs or None, self.reshape, self.output_key,
                                         probe=getattr(self.prep.loaded, "static_batch", None) or 1)
        for lay in self.cam_layers:
            g = lay.layout.grid
            self.notes(f"layer: {lay.name} ({lay.layout.kind}, {g[0]}x{g[1]} grid, {lay.layout.channels} channels)")
        if "scorecam" in self.methods:
            plan = self.prep.plan
            n_images = len(plan.paths) if plan.paths else int(x.shape[0])
            per = sum(lay.layout.channels for lay in self.cam_layers)
            runs = sum(-(-lay.layout.channels // self.scorecam_batch) for lay in self.cam_layers) * n_images
            self.notes(f"scorecam: {per} masked inputs per image ({n_images} image(s): {per * n_images} in all), "
                       f"run as {runs} forward passes of up to {self.scorecam_batch} (--scorecam-batch)")
        names = [lay.name for lay in self.cam_layers]
        if self.fuse and len(names) > 1:
            names.append("fused:" + "+".join(names))
        self.columns = self.drawer.columns = [(m, n) for n in names for m in self.methods]

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.cam import compute_cams

        if self.cam_layers is None:
            self._resolve(batch.tensor)
        res = compute_cams(self.prep.loaded.model, batch.tensor, layers=self.cam_layers, methods=self.method_items,
                           target=self.spec, output_key=self.output_key, scorecam_batch=self.scorecam_batch,
                           fuse=self.fuse, progress=self.progress)
        for key in self.passes:
            self.passes[key] += res.passes[key]
        self.warnings.extend(res.notes)
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
        from inspect_model.render.cam_report import image_record

        for m in res.maps:
            if m.sample == i:
                for w in m.warnings:
                    self.warnings.add(f"{name}: {m.method} at {m.layer} for class {m.target}: {w}")
        size = list(img.image.size) if img is not None else None
        return image_record(res, i, index=index, name=name, size=size, categories=self.prep.categories,
                            top=self.top)

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
        if self.evaluator is not None:
            payload["evaluation"] = self.evaluator.summary(self.entries, self.columns)
        return Result("cam", self.resolved_options(), payload, self.warnings.to_list(), record=None)

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(
            self.mopts, layers=[lay.name for lay in self.cam_layers or []], layer_specs=self.layer_specs or ["auto"],
            reshape=list(self.reshape) if self.reshape else None, target=self.target_text,
            methods=list(self.methods), fuse=self.fuse, output_key=self.output_key,
            scorecam_batch=self.scorecam_batch, colormap=self.colormap, alpha=self.alpha, top=self.top,
            save_raw=self.save_raw, **self.eval_options)

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "passes": dict(self.passes), "warnings": self.warnings,
                "cam_layers": self.cam_layers, "columns": list(self.columns), "drawer": self.drawer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = list(state["entries"])
        self.passes = {k: count(state["passes"][k], f"the {k} pass count") for k in self.passes}
        self.warnings = state["warnings"]
        self.cam_layers = state["cam_layers"]
        self.columns = self.drawer.columns = [(str(m), str(n)) for m, n in state["columns"]]
        self.drawer.load_state_dict(state["drawer"])

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.entries = [e for st in states for e in st["entries"]]
        self.passes = {k: sum(st["passes"][k] for st in states) for k in self.passes}
        self.warnings.merge(st["warnings"] for st in states[1:])
        first = next((st for st in states if st["cam_layers"]), None)  # the same on every rank that ran
        if self.cam_layers is None and first is not None:
            self.cam_layers = first["cam_layers"]
            self.columns = self.drawer.columns = [(str(m), str(n)) for m, n in first["columns"]]
        self.drawer.merge([st["drawer"] for st in states])

def cam(model: Any, images: Any = None, *, methods: list[str] | None = None, layers: list[str] | None = None,
        target: str = "predicted", reshape: str | None = None, fuse: bool = False, output_key: str | None = None,
        scorecam_batch: int = 32, colormap: str = "jet", alpha: float = 0.5, top: int = 5,
        save_raw: bool = False, evaluate: bool = False, metrics: list[str] | None = None, boxes: Any = None,
        eval_steps: int = 32, eval_batch: int = 64,
        model_options: ModelOptions | None = None, inputs: InputOptions | None = None,
        output_dir: Any = None, force: bool = False, tensorboard: Any = None, keep: bool | None = None,
        on_item: Any = None, notes: Any = None, progress: Any = None) -> Result:
    """Class activation maps of ``images`` (paths, or a tensor (N, C, H, W)) under ``model``
    (a spec, an ``nn.Module`` or a ``LoadedModel``). The result's ``to_dict()`` is the CLI's
    ``--json``; ``save(dir)`` (or ``output_dir=``) writes the CLI's files. ``evaluate=True``
    adds faithfulness scores (``metrics``, default all; ``boxes``: a boxes file for the
    pointing and energy games; see :mod:`inspect_model.api.cam_evaluate`)."""
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    check_cam_request(methods=methods or ["gradcam"], layers=layers, reshape=reshape, fuse=fuse,
                      scorecam_batch=scorecam_batch, colormap=colormap, alpha=alpha, top=top)
    from inspect_model.api.cam_evaluate import check_evaluate_request

    check_evaluate_request(evaluate=evaluate, metrics=metrics, boxes=boxes, steps=eval_steps, batch=eval_batch)
    prep = prepare("cam", mopts, inputs, notes=notes)
    session = CamSession(prep, mopts, methods=methods, layers=layers, reshape=reshape, fuse=fuse, target=target,
                         output_key=output_key, scorecam_batch=scorecam_batch, colormap=colormap, alpha=alpha,
                         top=top, save_raw=save_raw, notes=notes, evaluate=evaluate, metrics=metrics, boxes=boxes,
                         eval_steps=eval_steps, eval_batch=eval_batch, progress=progress)
    total = len(prep.plan.paths) if prep.plan.paths else 0
    return execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir, force=force,
                   keep=keep, tensorboard=tensorboard, on_item=on_item)
