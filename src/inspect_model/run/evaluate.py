"""``cam --evaluate``: faithfulness scores of every map the cam session computes.

:class:`Evaluator` rides along the :class:`~inspect_model.api.cam.CamSession`: each batch's
maps are scored by :func:`~inspect_model.methods.faithfulness.passes.evaluate_maps` (all
perturbed inputs in one queue, one forward pass per ``batch``), each map record gets an
``evaluation`` object and each image's maps are ranked; ``summary`` averages per method and
layer. Boxes (``--boxes``) are checked against the inputs before any pass runs.
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import InputError, UsageError

DEFAULT_STEPS = 32


def parse_eval_steps(steps: int | str) -> int | str:
    """``--eval-steps``: a number, or ``auto`` (each curve refined until its AUC is stable)."""
    if isinstance(steps, str):
        if steps.strip().lower() == "auto":
            return "auto"
        try:
            return int(steps)
        except ValueError:
            raise UsageError(f"--eval-steps '{steps}': give a number of steps (32) or auto") from None
    return steps


def check_evaluate_request(*, evaluate: bool, metrics: list[str] | None, boxes: Any, steps: int | str,
                           batch: int | None, tolerance: float = 0.005) -> list[str]:
    """The --evaluate options that need no model; the metrics asked for ([] without --evaluate)."""
    from inspect_model.methods.faithfulness.metrics import parse_metrics

    if not evaluate:
        if metrics:
            raise UsageError("--metric needs --evaluate")
        if boxes is not None:  # boxes to explain (a detector, a segmenter, a flow model's region): read at once
            from inspect_model.loading.boxes import load_boxes

            load_boxes(boxes)
        return []
    steps = parse_eval_steps(steps)
    if steps == "auto":
        if not (0 < tolerance < 1):
            raise UsageError(f"--eval-tolerance {tolerance}: give an AUC tolerance between 0 and 1 (0.005)")
    elif steps < 2:  # type: ignore[operator]
        raise UsageError(f"--eval-steps must be 2 or more, got {steps}")
    if batch is not None and batch < 1:
        raise UsageError(f"--eval-batch must be 1 or more, got {batch}")
    parsed = parse_metrics(metrics, boxes=boxes is not None)
    if boxes is not None:
        from inspect_model.loading.boxes import load_boxes

        load_boxes(boxes)
    return parsed


def rank_maps(entries: list[dict[str, Any]]) -> None:
    """Rank the scored maps of one image and one target rank against each other (their
    ``evaluation.rank``: the mean of their ranks over the metrics)."""
    from inspect_model.methods.faithfulness.metrics import mean_ranks

    for entry in entries:
        by_rank: dict[int, list[dict[str, Any]]] = {}
        for rec in entry["maps"]:
            by_rank.setdefault(rec["rank"], []).append(rec)
        for group in by_rank.values():
            for rec, r in zip(group, mean_ranks([g["evaluation"]["scores"] for g in group])):
                rec["evaluation"]["rank"] = r


class Evaluator:
    """Scores maps batch by batch (see the module docstring)."""

    def __init__(self, prep: Any, metrics: list[str], *, steps: int | str, batch: int | None, boxes: Any = None,
                 output_key: str | None = None, notes: Any = None, progress: Any = None,
                 tolerance: float = 0.005) -> None:
        self.prep, self.metrics, self.steps, self.batch = prep, metrics, parse_eval_steps(steps), batch
        self.tolerance = tolerance  # --eval-steps auto: the AUC change at which a curve stops
        self.used_batch: int | None = None  # the inputs per pass chosen (--eval-batch, else pass_rows)
        self.output_key, self.progress = output_key, progress
        self.source = str(boxes) if boxes is not None else None
        self.boxes: dict[str, list[Any]] = {}
        self.passes = 0
        self.inputs = 0
        if boxes is not None:
            self._check_boxes(boxes)
        notes = notes or (lambda text: None)
        from inspect_model.methods.faithfulness.passes import inputs_per_map

        per = inputs_per_map(metrics, 8 if self.steps == "auto" else int(self.steps))
        notes(f"evaluate: {', '.join(metrics)}; {per} perturbed inputs per map"
              + (f" at first (--eval-steps auto: curves refined 8, 16, ... 128 steps while their AUC moves by more "
                 f"than {self.tolerance})" if self.steps == "auto" else "")
              + " (and the curves' ends, shared by "
              f"the maps of an image), run in forward passes of "
              + (f"up to {batch} (--eval-batch)" if batch is not None else
                 "up to 64 (on a CPU, up to 4 MiB of input: --eval-batch sets it)"))

    def _check_boxes(self, path: Any) -> None:
        from inspect_model.loading.boxes import check_inside, load_boxes, match_boxes

        plan = self.prep.plan
        if plan.paths:
            names = [str(p) for p in plan.paths]
        else:
            names = list(getattr(plan, "names", None) or [])
        self.boxes = match_boxes(load_boxes(path), names, str(path))
        for name, bs in self.boxes.items():
            if plan.paths:
                from inspect_model.loading.images import header_size

                try:
                    width, height = header_size(name)  # a regular file, its header only (issue 41)
                except (OSError, InputError):
                    continue  # an unreadable image fails (or is skipped) where it is read
            else:
                height, width = (int(v) for v in plan.tensor.shape[-2:])
            check_inside(bs, width, height, name, str(path))

    def _inside(self, name: str, img: Any, hw: tuple[int, int]) -> Any:
        """The boxes of image ``name`` as an (H, W) mask over the model input, or None."""
        from inspect_model.methods.faithfulness.metrics import box_mask

        bs = self.boxes.get(name)
        if bs is None:
            return None
        pre = self.prep.plan.preprocess
        if img is not None and pre is not None:
            left, top, right, bottom = pre.uncrop_box(*img.image.size)
            sx, sy = hw[1] / (right - left), hw[0] / (bottom - top)
            bs = [((x0 - left) * sx, (y0 - top) * sy, (x1 - left) * sx, (y1 - top) * sy) for x0, y0, x1, y1 in bs]
        return box_mask(hw, bs)

    def feed(self, res: Any, batch: Any, entries: list[dict[str, Any]]) -> None:
        """Score the maps of ``res`` (one cam batch); ``entries`` are the batch's image records."""
        from inspect_model.methods.faithfulness.passes import MapJob

        x = batch.tensor
        hw = (int(x.shape[-2]), int(x.shape[-1]))
        jobs, recs = [], []
        for i, entry in enumerate(entries):
            img = batch.images[i] if batch.images is not None else None
            inside = self._inside(batch.names[i], img, hw) if self.boxes else None
            maps = [m for m in res.maps if m.sample == i]
            for m, rec in zip(maps, entry["maps"]):
                jobs.append(MapJob(i, m.target, m.map, inside,
                                   seed=int(self.prep.plan.seed) * 1_000_003 + int(entry["index"])))
                recs.append(rec)
        original = [float(res.probabilities[j.sample][j.target]) for j in jobs]
        self._score(jobs, recs, original, batch, entries)

    def feed_dense(self, res: Any, batch: Any, entries: list[dict[str, Any]], objective: Any) -> None:
        """Score the maps of a detector's or segmenter's batch (``methods.cam.tasks``) on the
        same targets: each perturbed input's probability of the explained detection or mask
        (``objective.probability``), read with the model's threshold at 0 (issue 24)."""
        from inspect_model.methods.faithfulness.passes import MapJob

        x = batch.tensor
        hw = (int(x.shape[-2]), int(x.shape[-1]))
        jobs, recs = [], []
        for i, entry in enumerate(entries):
            img = batch.images[i] if batch.images is not None else None
            inside = self._inside(batch.names[i], img, hw) if self.boxes else None
            maps = [m for m in res.maps if m.row.sample == i]
            for m, rec in zip(maps, entry["maps"]):
                seed = int(self.prep.plan.seed) * 1_000_003 + int(entry["index"])
                jobs.append(MapJob(i, m.row, m.map, inside, seed=seed))
                recs.append(rec)
        with objective.scoring():
            self._score(jobs, recs, None, batch, entries, read=objective.probability)

    def _score(self, jobs: list[Any], recs: list[dict[str, Any]], original: list[float] | None, batch: Any,
               entries: list[dict[str, Any]], read: Any = None) -> None:
        from inspect_model.methods.faithfulness.passes import count_inputs, evaluate_maps

        x = batch.tensor
        first_steps = 8 if self.steps == "auto" else int(self.steps)  # auto: the first level's inputs
        total = count_inputs([j.sample for j in jobs], self.metrics, first_steps, original_known=original is not None,
                             shared=read is None)
        first = entries[0]["index"] if entries else 0
        label = f"cam: evaluating image {first + 1}" + (f"-{first + len(entries)}" if len(entries) > 1 else "")

        def progress(done: int) -> None:
            if self.progress is None:
                return
            if _takes_label(self.progress):
                self.progress(done, total, label)  # the CLI's bar: "cam: evaluating image 3-4"
            else:
                self.progress(done, total)

        from inspect_model.methods.faithfulness.passes import pass_rows

        self.used_batch = pass_rows(x, self.batch)
        scored, passes = evaluate_maps(self.prep.loaded.model, x, jobs, metrics=self.metrics, steps=self.steps,
                                       batch=self.used_batch, output_key=self.output_key, original=original,
                                       progress=progress, read=read, tolerance=self.tolerance)
        self.passes += passes
        self.inputs += total if self.steps != "auto" else total + sum(
            n - 8 for s in scored for n in s.steps.values())  # the refined levels' new points
        for rec, s in zip(recs, scored):
            rec["evaluation"] = {"scores": dict(s.scores), "curves": dict(s.curves), "confidence": dict(s.confidence),
                                 "rank": None}
            if s.steps:
                rec["evaluation"]["steps"] = dict(s.steps)
        rank_maps(entries)

    def summary(self, entries: list[dict[str, Any]], columns: list[tuple[str, str]]) -> dict[str, Any]:
        """The ``evaluation`` object of the report: settings, passes and the per-method averages."""
        from inspect_model.methods.faithfulness import metrics as fa

        rows = []
        for method, layer in columns:
            recs = [m["evaluation"] for e in entries for m in e["maps"]
                    if m["method"] == method and m["layer"] == layer and "evaluation" in m]
            if not recs:
                continue
            curves: dict[str, list[float]] = {}
            for name in ("deletion", "insertion", "road_morf", "road_lerf"):
                have = [r["curves"][name] for r in recs if name in r["curves"]]
                if len({len(v) for v in have}) > 1:  # --eval-steps auto: curves of several lengths
                    have = [_resample(v, max(len(h) for h in have)) for v in have]
                if have:
                    curves[name] = [sum(v) / len(have) for v in zip(*have)]
            ranks = [r["rank"] for r in recs if r["rank"] is not None]
            rows.append({"method": method, "layer": layer, "maps": len(recs),
                         "scores": fa.summarise([r["scores"] for r in recs]), "curves": curves,
                         "mean_image_rank": sum(ranks) / len(ranks) if ranks else None})
        for row, r in zip(rows, fa.mean_ranks([row["scores"] for row in rows])):
            row["rank"] = r
        rows.sort(key=lambda row: (row["rank"] is None, row["rank"] or 0.0))
        return {
            "metrics": list(self.metrics),
            "steps": self.steps,
            **({"tolerance": self.tolerance} if self.steps == "auto" else {}),
            "batch": self.used_batch if self.used_batch is not None else self.batch,
            "road_fractions": list(fa.ROAD_FRACTIONS),
            "road_noise": fa.ROAD_NOISE,
            "insertion_blur": {"kernel": fa.BLUR_KERNEL, "sigma": fa.BLUR_SIGMA},
            "boxes": self.source,
            "passes": self.passes,
            "inputs": self.inputs,
            "average": rows,
            "plots": [],
        }


def _resample(curve: list[float], n: int) -> list[float]:
    """``curve`` (evenly spaced on [0, 1]) read at ``n`` even points, linearly between its own."""
    m = len(curve) - 1
    out = []
    for i in range(n):
        t = i * m / (n - 1) if n > 1 else 0.0
        k = min(int(t), m - 1) if m > 0 else 0
        out.append(curve[k] + (t - k) * (curve[k + 1] - curve[k]) if m > 0 else curve[0])
    return out


def _takes_label(fn: Any) -> bool:
    """Whether a progress callback takes a third (label) argument; an API user's may not."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_POSITIONAL for p in params) or len(params) >= 3
