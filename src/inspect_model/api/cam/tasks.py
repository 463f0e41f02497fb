"""``cam`` on detectors and segmenters (issue 24): the part of a :class:`CamSession` that
explains detections and segmentation masks instead of class scores.

Per image: one map per row of the objective (a detection at or above ``--score-threshold``,
or a class's mask) per method; pictures with the explained box (class and score) or the
mask's outline drawn on the overlay, a legend picture of a segmentation's classes and areas
(``legend.png``), and rows of the contact sheets (drawn by :mod:`inspect_model.render.draw_dense`).
When no detection passes the threshold the run still succeeds, with one warning that names
the best score and the option to lower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_model.run.session import ImageItem
from inspect_model.errors import LayerSelectionError, UsageError


def dense_task(prep: Any) -> str:
    """``detection``, ``segmentation`` or ``classification`` for the prepared model."""
    from inspect_model.methods.objectives.tasks import infer_task

    return infer_task(prep.loaded.model, prep.loaded)


def resolve_task_layer(model: Any, task: str, specs: list[str], x: Any) -> str:
    """``--layer auto`` (the task's own default) or one layer spec."""
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.objectives.tasks import task_auto_layer

    if len(specs) > 1:
        raise UsageError(f"a {task} model takes one --layer (a feature pyramid counts as one); got {len(specs)}")
    if not specs or specs[0].strip().lower() == "auto":
        name = task_auto_layer(model, task)
        if name is None:
            raise LayerSelectionError(f"no default map layer is known for {type(model).__name__}; "
                                      "pass --layer NAME (the backbone's last stage)")
        return name
    spec = specs[0]
    plain = not any(ch in spec for ch in "*?[") and not spec.startswith("type:")
    names = list(dict.fromkeys(select_layers(model, [spec], leaves_only=not plain)))
    if len(names) != 1:
        raise LayerSelectionError(f"--layer '{spec}' selects {len(names)} layers; give exactly one")
    return names[0]


class DenseCam:
    """What :class:`~inspect_model.api.cam.CamSession` delegates to for a dense task."""

    def __init__(self, session: Any, task: str, request: Any) -> None:
        from inspect_model.methods.cam import base as cam_base
        from inspect_model.methods.cam.base import task_names
        from inspect_model.methods.cam.maps import cam_is_optional
        from inspect_model.methods.objectives.scores import make_objective
        from inspect_model.methods.cam.tasks import check_task_methods

        self.s, self.task = session, task
        prep = session.prep
        from inspect_model.run.objective_options import one_target

        target, max_detections, boxes = one_target(prep, request.target), request.max_detections, request.boxes
        self.objective = make_objective(task, prep.loaded.model, target, prep.categories,
                                        score_threshold=request.score_threshold, max_detections=max_detections)
        methods = list(session.methods)
        if cam_is_optional(session.method_items):  # from `all`: what this task cannot explain is left out
            for m in [m for m in methods if m not in task_names(task) and cam_base.get(m).in_all == "if-fits"]:
                methods.remove(m)
                session.warnings.add(f"{m} left out of --method all: a {task} model has no classifier of class "
                                     "scores")
        self.methods = check_task_methods(methods, task)
        session.methods = self.methods
        self.options = {"task": task, "score_threshold": getattr(self.objective, "threshold", None),
                        "max_detections": max_detections if task == "detection" else None}
        self.boxes_path = boxes
        self.boxes: dict[str, list[Any]] | None = None
        self.layer: str | None = None
        self.layer_info: dict[str, Any] | None = None

    # ------------------------------------------------------------------ computing
    def _named_boxes(self, batch: Any) -> list[list[Any]] | None:
        if self.boxes_path is None:
            return None
        from inspect_model.loading.boxes import load_labelled_boxes, match_boxes
        from inspect_model.loading.geometry import picture_frame
        from inspect_model.methods.objectives.targets import parse_target

        if self.boxes is None:
            names = list(self.s.prep.plan.paths) if self.s.prep.plan.paths else []
            self.boxes = match_boxes(load_labelled_boxes(self.boxes_path), [str(n) for n in names],
                                     str(self.boxes_path))
        pre = self.s.prep.plan.preprocess
        hw = (int(batch.tensor.shape[-2]), int(batch.tensor.shape[-1]))
        out = []
        for i, name in enumerate(batch.names):
            # the mapping the pictures and image_box use, inverted; a tensor input is its own picture
            frame = picture_frame(pre, batch.images[i].image if batch.images is not None else None, hw)
            rows = []
            for box, label in self.boxes.get(name, []):
                idx = None
                if label is not None:
                    idx = parse_target(label, self.s.prep.categories).index
                rows.append((frame.from_picture(box) if frame is not None else tuple(map(float, box)), idx))
            out.append(rows)
        return out

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.loading.geometry import picture_frame
        from inspect_model.methods.cam.tasks import compute_task_cams

        model = self.s.prep.loaded.model
        if self.layer is None:
            self.layer = resolve_task_layer(model, self.task, self.s.layer_specs, batch.tensor)
            self.s.columns = self.s.drawer.columns = [(m, self.layer) for m in self.methods]
        self.objective.boxes = self._named_boxes(batch)
        res = compute_task_cams(model, batch.tensor, self.objective, self.layer, self.methods)
        if self.layer_info is None:
            self.layer_info = res.layer
            g = res.layer["grid"]
            levels = f", {len(res.layer['levels'])} pyramid levels on one grid" if "levels" in res.layer else ""
            self.s.notes(f"layer: {self.layer} ({res.layer['kind']}, {g[0]}x{g[1]} grid, "
                         f"{res.layer['channels']} channels{levels})")
        for key in self.s.passes:
            self.s.passes[key] += res.passes[key]
        self.s.warnings.extend(res.notes)
        items = []
        for i in range(batch.tensor.shape[0]):
            index = self.s.index_base + len(self.s.entries)
            name = batch.names[i]
            img = batch.images[i] if batch.images is not None else None
            maps = [m for m in res.maps if m.row.sample == i]
            frame = picture_frame(self.s.prep.plan.preprocess, img.image if img is not None else None,
                                  (int(batch.tensor.shape[-2]), int(batch.tensor.shape[-1])))
            entry = self._entry(res, i, maps, index, name, img, frame)
            self.s.entries.append(entry)
            extra = {"class_map": res.selection.class_maps[i] if res.selection.class_maps else None,
                     "detections": res.selection.detections[i] if res.selection.detections else []}
            items.append(ImageItem(entry, (img, batch.tensor[i], maps, extra)))
        self.objective.note_empty(model, batch.tensor, res.selection, batch.names)
        if self.s.evaluator is not None:  # deletion/insertion on the same targets
            self.s.evaluator.feed_dense(res, batch, self.s.entries[-len(items):], self.objective)
        return items

    def _entry(self, res: Any, i: int, maps: list[Any], index: int, name: str, img: Any,
               frame: Any) -> dict[str, Any]:
        """One image's report; ``frame`` (a PictureFrame, None for a tensor input) puts every box
        on the original picture too (``image_box``), as the pictures draw it."""
        rows = [r for r in res.selection.rows if r.sample == i]
        for m in maps:
            for w in m.warnings:
                self.s.warnings.add(f"{name}: {m.method} at {m.layer} for {self._what(m.row)}: {w}")
        records = []
        for m in maps:
            prob = m.row.confidence if self.task == "detection" else None
            records.append({
                "method": m.method, "layer": m.layer, "rank": m.row.rank,
                "target": {"class": m.row.label, "label": m.row.name, "score": m.row.score, "probability": prob},
                "class_independent": m.class_independent, "raw_min": m.raw_min, "raw_max": m.raw_max,
                "warnings": list(m.warnings), "files": {}, "stats": m.stats(),
                self.task: m.row.record(frame),
            })
        entry: dict[str, Any] = {
            "index": index, "image": name, "size": list(img.image.size) if img is not None else None,
            "task": self.task, "predictions": [], "targets": [r.label for r in rows], "maps": records, "files": {},
        }
        if self.task == "detection":
            dets = res.selection.detections[i] if res.selection.detections else []
            entry["predictions"] = [{"class": lab, "label": _name(lab, self.s.prep.categories), "score": sc,
                                     "probability": sc, "box": box,
                                     "image_box": frame.to_picture(box) if frame is not None else None}
                                    for box, lab, sc in dets[: self.s.top]]
            entry["detections"] = [r.record(frame) for r in rows]
        else:
            entry["segments"] = [r.record(frame) for r in rows]
            entry["legend"] = res.selection.per_sample[i]["classes"]
        return entry

    def _what(self, row: Any) -> str:
        from inspect_model.render.draw_dense import describe_row

        return describe_row(row, self.task)

    def finish(self, payload: dict[str, Any]) -> None:
        payload["task"] = self.task
        payload["score_threshold"] = self.options["score_threshold"]
        if self.layer_info is not None:
            payload["layers"] = [self.layer_info]
        empty = self.objective.empty_warning()
        if empty is not None:
            self.s.warnings.add(empty)

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "layer_info": self.layer_info}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.layer, self.layer_info = state["layer"], state["layer_info"]

    def merge(self, states: list[dict[str, Any]]) -> None:
        first = next((st for st in states if st["layer"] is not None), None)  # the same on every rank that ran
        if self.layer is None and first is not None:
            self.load_state_dict(first)


def _name(index: int, categories: Any) -> str | None:
    from inspect_model.methods.objectives.scores import class_name

    return class_name(index, categories)
