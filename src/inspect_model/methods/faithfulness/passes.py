"""The model passes behind ``cam --evaluate``: every perturbed input of every map goes into
one queue, and each full queue is one forward pass (no gradients, eval mode, restored by the
hook engine). :func:`evaluate_maps` builds the inputs with :mod:`.faithfulness`, scores them
and turns the target probabilities into each map's scores and curves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.methods.faithfulness import metrics as fa

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class MapJob:
    """One map to score: image ``sample`` of the batch, class ``target``, the map (H, W) in
    [0, 1], and the boxes' pixels (H, W) bool when the pointing/energy games are asked."""

    sample: int
    target: int
    saliency: torch.Tensor
    inside: torch.Tensor | None = None
    seed: int = 0


@dataclass
class MapScores:
    """What one map scored: ``scores`` (see :data:`.faithfulness.SCORES`) and the curves."""

    scores: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[float]] = field(default_factory=dict)
    confidence: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # --eval-steps auto: the steps each curve took


def inputs_per_map(metrics: Sequence[str], steps: int) -> int:
    """How many perturbed inputs one map costs, besides the inputs its image shares with the
    other maps (:func:`count_inputs`): a curve's two ends are the image itself, the baseline
    (0) or the blurred image, scored once per batch or per image."""
    n = 0
    n += (steps - 1) if "deletion" in metrics else 0
    n += (steps - 1) if "insertion" in metrics else 0
    n += 2 * len(fa.ROAD_FRACTIONS) if "road" in metrics else 0
    n += 1 if "confidence" in metrics else 0
    return n


def count_inputs(samples: Sequence[int], metrics: Sequence[str], steps: int, *, original_known: bool,
                 shared: bool = True) -> int:
    """The inputs :func:`evaluate_maps` runs for maps of the given ``samples`` (one per map).
    ``shared``: the curves' ends are scored once (a classifier); a detector's or segmenter's
    target is read per map, so each map scores its own ends then."""
    per = inputs_per_map(metrics, steps)
    curves = [m for m in ("deletion", "insertion") if m in metrics]
    if not shared:
        return len(samples) * (per + 2 * len(curves) + (0 if original_known or "confidence" not in metrics else 1))
    images = len(set(samples))
    ends = 0
    if "deletion" in metrics:
        ends += 1  # the all-zero input, one for the batch
    if "insertion" in metrics:
        ends += images  # each image's blurred copy
    if not original_known and (curves or "confidence" in metrics):
        ends += images  # each image itself
    return len(samples) * per + ends


class Scorer:
    """A queue of perturbed inputs: ``add`` them with the class to read, one forward pass per
    ``batch`` inputs; ``probs[key]`` are the target probabilities in the order added."""

    def __init__(self, model: nn.Module, output_key: str | None, batch: int,
                 progress: Callable[[int], None] | None = None, expected: int = 0,
                 read: Callable[..., list[float]] | None = None) -> None:
        """``expected``: how many inputs will be added (decides whether the passes run on an
        inference copy of the model, :mod:`.inference_copy`); ``read(out, x, targets)``: the
        probabilities of a detector's or segmenter's targets (issue 24), from the model's output."""
        from inspect_model.methods.cam.passes import scores_of
        from inspect_model.methods.inference_copy import InferenceRunner

        self.model, self.output_key, self.batch, self.progress = model, output_key, batch, progress
        # read(out, x, targets) -> probabilities: a detector's or segmenter's target (issue 24)
        self.read = read
        self.pending: list[tuple[Any, torch.Tensor, int]] = []  # (key, input (C, H, W), class)
        self.probs: dict[Any, list[float]] = {}
        self.rows: dict[Any, torch.Tensor] = {}  # key -> every class's probability (cls None)
        self.passes = 0
        self.done = 0
        self.runner = InferenceRunner(model, model, lambda out: scores_of(out, output_key), expected)

    def add(self, key: Any, inputs: torch.Tensor, cls: int | None) -> None:
        """Queue ``inputs`` (B, C, H, W) under ``key``; ``cls`` None keeps every class's
        probability (an input shared by maps of several targets: ``rows[key]``)."""
        for t in inputs:
            self.pending.append((key, t, cls))
            if len(self.pending) >= self.batch:
                self.run()

    def run(self) -> None:
        import torch

        from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward

        if not self.pending:
            return
        chunk, self.pending = self.pending[:self.batch], self.pending[self.batch:]
        x = torch.stack([t for _, t, _ in chunk])  # (B, C, H, W)
        # No hooks: the engine only puts the model in eval mode without grad, and restores it.
        with HookEngine(self.model, [], CaptureOptions(outputs=False, grad_enabled=False)) as eng:
            if self.read is not None:  # a detector or segmenter: read from the model's own output
                out = run_forward(eng, lambda: self.model(x))
                picked = self.read(out, x, [c for _, _, c in chunk])
            else:
                self.runner.forward = lambda t: run_forward(eng, lambda: self.model(t))
                probs = self.runner.probs(x)  # (B, classes)
                cls = torch.tensor([0 if c is None else c for _, _, c in chunk], device=probs.device)
                picked = probs.gather(1, cls[:, None])[:, 0].tolist()
                for i, (key, _, c) in enumerate(chunk):
                    if c is None:
                        self.rows[key] = probs[i].float().cpu()
        for (key, _, c), p in zip(chunk, picked):
            if c is not None or self.read is not None:
                self.probs.setdefault(key, []).append(p)
        self.passes += 1
        self.done += len(chunk)
        if self.progress is not None:
            self.progress(self.done)


DEFAULT_BATCH = 64  # perturbed inputs per pass on an accelerator (on a CPU: pass_rows)


def pass_rows(x: torch.Tensor, batch: int | None) -> int:
    """Perturbed inputs per forward pass: ``batch`` (--eval-batch) when given, else
    DEFAULT_BATCH, fewer on a CPU for large inputs (``cam_passes.cpu_rows``: 6 at 224 px)."""
    from inspect_model.methods.cam.passes import cpu_rows

    if batch is not None:
        return batch
    return DEFAULT_BATCH if x.device.type != "cpu" else cpu_rows(x, DEFAULT_BATCH)


# --eval-steps auto (issue 40): every curve starts at AUTO_STEPS[0] steps and is refined by
# halving its steps (the new points only: step_counts at 2s holds those at s at even k) while
# its AUC moves by more than the tolerance between two levels; at most AUTO_STEPS[-1].
AUTO_STEPS = (8, 16, 32, 64, 128)
DEFAULT_TOLERANCE = 0.005


def evaluate_maps(model: nn.Module, x: torch.Tensor, jobs: Sequence[MapJob], *, metrics: Sequence[str],
                  steps: int | str = 32, batch: int | None = None, output_key: str | None = None,
                  original: Sequence[float] | None = None,
                  progress: Callable[[int], None] | None = None,
                  read: Callable[..., list[float]] | None = None,
                  tolerance: float = DEFAULT_TOLERANCE) -> tuple[list[MapScores], int]:
    """Scores of each job's map on the batch ``x`` (N, C, H, W), and the forward passes run.
    ``original[j]``: the unperturbed target probability of job j (the confidence metric's Y,
    the first point of deletion and the last of insertion); scored once per image when not
    given. The curves' other ends, the all-zero input and each image's blurred copy, are
    scored once and read for every map (:func:`count_inputs`). ``steps="auto"``: each curve's
    steps chosen by ``tolerance`` on its AUC (:data:`AUTO_STEPS`; :func:`_refine`); the scores'
    ``steps`` say how many each curve took."""
    import torch

    hw = (int(x.shape[-2]), int(x.shape[-1]))
    x = x.detach()
    auto = steps == "auto"
    first_steps = AUTO_STEPS[0] if auto else int(steps)
    shared = read is None  # a detector's or segmenter's target is read per map
    expected = count_inputs([j.sample for j in jobs], metrics, first_steps, original_known=original is not None,
                            shared=shared)
    scorer = Scorer(model, output_key, pass_rows(x, batch), progress, expected, read)
    blurred = fa.gaussian_blur(x.float()).to(x.dtype) if "insertion" in metrics else None
    counts = fa.step_counts(hw[0] * hw[1], first_steps)
    orders = []
    ends = _Ends(scorer, x, blurred, original, shared)
    for j, job in enumerate(jobs):
        xi = x[job.sample]
        gen = torch.Generator().manual_seed(job.seed)
        order = fa.pixel_order(job.saliency, gen)
        orders.append(order)
        if "deletion" in metrics:
            scorer.add((j, "deletion"), fa.causal_inputs(xi, torch.zeros_like(xi), order, counts[1:-1]), job.target)
            ends.want(j, job, "image", "zero")
        if "insertion" in metrics:
            assert blurred is not None
            scorer.add((j, "insertion"), fa.causal_inputs(blurred[job.sample], xi, order, counts[1:-1]), job.target)
            ends.want(j, job, "blur", "image")
        if "road" in metrics:
            # MoRF and LeRF masks in one batch: one multigrid hierarchy build, one solve.
            masks = torch.cat([fa.road_masks(order, hw, fa.ROAD_FRACTIONS, first) for first in (True, False)])
            imputed = fa.impute(xi, masks.to(x.device), noise=fa.ROAD_NOISE, generator=gen)
            k = len(fa.ROAD_FRACTIONS)
            scorer.add((j, "road_morf"), imputed[:k], job.target)
            scorer.add((j, "road_lerf"), imputed[k:], job.target)
        if "confidence" in metrics:
            ends.want(j, job, "image")
            masked = xi * job.saliency.to(device=x.device, dtype=x.dtype)[None]
            scorer.add((j, "masked"), masked[None], job.target)
    scorer.run()
    while scorer.pending:
        scorer.run()
    used: dict[tuple[int, str], int] = {}
    if auto:
        used = _refine(scorer, x, blurred, jobs, orders, ends, metrics, tolerance)
    out = [_scores(j, job, scorer, ends, metrics) for j, job in enumerate(jobs)]
    for (j, name), n in used.items():
        out[j].steps[name] = n
    return out, scorer.passes


def _refine(scorer: Scorer, x: torch.Tensor, blurred: torch.Tensor | None, jobs: Sequence[MapJob],
            orders: list[torch.Tensor], ends: _Ends, metrics: Sequence[str], tolerance: float) -> dict[Any, int]:
    """``--eval-steps auto``: refine every deletion/insertion curve level by level (all curves
    of a level in one queue of full passes) until its AUC moves by at most ``tolerance``; the
    final interior points are left in ``scorer.probs`` as a fixed-steps run leaves them.
    Returns the steps each (map, curve) took."""
    import torch

    hw = (int(x.shape[-2]), int(x.shape[-1]))
    curves = [name for name in ("deletion", "insertion") if name in metrics]
    steps = {(j, name): AUTO_STEPS[0] for j in range(len(jobs)) for name in curves}
    prev: dict[tuple[int, str], float] = {}  # each curve's AUC at its previous level
    todo = list(steps)
    while todo:
        now = {}
        for key in todo:  # the AUC at this level
            j, name = key
            first, last = ("image", "zero") if name == "deletion" else ("blur", "image")
            now[key] = fa.auc([ends.value(j, jobs[j], first), *scorer.probs[key], ends.value(j, jobs[j], last)])
        # One level further: after the first level always (two AUCs to compare), then while the AUC moves.
        nxt = [k for k in todo
               if steps[k] < AUTO_STEPS[-1] and (k not in prev or abs(now[k] - prev[k]) > tolerance)]
        prev.update(now)
        for key in nxt:
            j, name = key
            job = jobs[j]
            s = steps[key] * 2
            new_counts = fa.step_counts(hw[0] * hw[1], s)[1:-1:2]  # the odd points: the new ones
            xi = x[job.sample]
            start, finish = (xi, torch.zeros_like(xi)) if name == "deletion" else (blurred[job.sample], xi)
            scorer.add((key, s), fa.causal_inputs(start, finish, orders[j], new_counts), job.target)
        scorer.run()
        while scorer.pending:
            scorer.run()
        for key in nxt:
            s = steps[key] * 2
            old, new = scorer.probs.pop(key), scorer.probs.pop((key, s))
            merged = [v for pair in zip(new, old + [None]) for v in pair if v is not None]  # odd, even, odd, ...
            scorer.probs[key] = merged
            steps[key] = s
        todo = nxt
    return steps


class _Ends:
    """The inputs at the ends of the curves: the image itself, the all-zero input and the
    blurred image. Shared by every map of a classifier (their whole probability rows are
    kept); a detector's or segmenter's are scored per map."""

    def __init__(self, scorer: Scorer, x: torch.Tensor, blurred: torch.Tensor | None,
                 original: Sequence[float] | None, shared: bool) -> None:
        self.scorer, self.x, self.blurred, self.original, self.shared = scorer, x, blurred, original, shared

    def _input(self, kind: str, sample: int) -> torch.Tensor:
        import torch

        if kind == "zero":
            return torch.zeros_like(self.x[sample])
        return (self.blurred if kind == "blur" else self.x)[sample]

    def _key(self, j: int, job: MapJob, kind: str) -> Any:
        if not self.shared:
            return (j, "end", kind)
        return ("end", kind) if kind == "zero" else ("end", kind, job.sample)

    def want(self, j: int, job: MapJob, *kinds: str) -> None:
        for kind in kinds:
            if kind == "image" and self.original is not None:
                continue
            key = self._key(j, job, kind)
            if key not in self.scorer.rows and key not in self.scorer.probs and \
                    all(k != key for k, _, _ in self.scorer.pending):
                self.scorer.add(key, self._input(kind, job.sample)[None], None if self.shared else job.target)

    def value(self, j: int, job: MapJob, kind: str) -> float:
        if kind == "image" and self.original is not None:
            return float(self.original[j])
        key = self._key(j, job, kind)
        if self.shared:
            return float(self.scorer.rows[key][job.target])
        return self.scorer.probs[key][0]


def _scores(j: int, job: MapJob, scorer: Scorer, ends: _Ends, metrics: Sequence[str]) -> MapScores:
    res = MapScores()
    got = {name: scorer.probs.get((j, name), []) for name in ("deletion", "insertion", "road_morf", "road_lerf",
                                                               "masked")}
    for name, first, last in (("deletion", "image", "zero"), ("insertion", "blur", "image")):
        if name in metrics:
            res.curves[name] = [ends.value(j, job, first), *got[name], ends.value(j, job, last)]
            res.scores[name] = fa.auc(res.curves[name])
    if "road" in metrics:
        res.curves["road_morf"], res.curves["road_lerf"] = got["road_morf"], got["road_lerf"]
        res.scores.update(fa.road_scores(got["road_morf"], got["road_lerf"]))
    if "confidence" in metrics:
        y, o = ends.value(j, job, "image"), got["masked"][0]
        res.confidence = {"original": y, "masked": o}
        res.scores.update(fa.confidence_change(y, o))
    if job.inside is not None:
        if "pointing" in metrics:
            res.scores["pointing"] = fa.pointing_hit(job.saliency, job.inside)
        if "energy" in metrics:
            res.scores["energy"] = fa.energy_fraction(job.saliency, job.inside)
    return res
