"""The model passes behind ``cam --evaluate``: every perturbed input of every map goes into
one queue, and each full queue is one forward pass (no gradients, eval mode, restored by the
hook engine). :func:`evaluate_maps` builds the inputs with :mod:`.faithfulness`, scores them
and turns the target probabilities into each map's scores and curves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.methods import faithfulness as fa

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


def inputs_per_map(metrics: Sequence[str], steps: int) -> int:
    """How many perturbed inputs one map costs."""
    n = 0
    n += (steps + 1) if "deletion" in metrics else 0
    n += (steps + 1) if "insertion" in metrics else 0
    n += 2 * len(fa.ROAD_FRACTIONS) if "road" in metrics else 0
    n += 1 if "confidence" in metrics else 0
    return n


class Scorer:
    """A queue of perturbed inputs: ``add`` them with the class to read, one forward pass per
    ``batch`` inputs; ``probs[key]`` are the target probabilities in the order added."""

    def __init__(self, model: nn.Module, output_key: str | None, batch: int,
                 progress: Callable[[int], None] | None = None, expected: int = 0,
                 read: Callable[..., list[float]] | None = None) -> None:
        """``expected``: how many inputs will be added (decides whether the passes run on an
        inference copy of the model, :mod:`.inference_copy`); ``read(out, x, targets)``: the
        probabilities of a detector's or segmenter's targets (issue 24), from the model's output."""
        from inspect_model.methods.cam_passes import scores_of
        from inspect_model.methods.inference_copy import InferenceRunner

        self.model, self.output_key, self.batch, self.progress = model, output_key, batch, progress
        # read(out, x, targets) -> probabilities: a detector's or segmenter's target (issue 24)
        self.read = read
        self.pending: list[tuple[Any, torch.Tensor, int]] = []  # (key, input (C, H, W), class)
        self.probs: dict[Any, list[float]] = {}
        self.passes = 0
        self.done = 0
        self.runner = InferenceRunner(model, model, lambda out: scores_of(out, output_key), -(-expected // batch))

    def add(self, key: Any, inputs: torch.Tensor, cls: int) -> None:
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
                cls = torch.tensor([c for _, _, c in chunk], device=probs.device)
                picked = probs.gather(1, cls[:, None])[:, 0].tolist()
        for (key, _, _), p in zip(chunk, picked):
            self.probs.setdefault(key, []).append(p)
        self.passes += 1
        self.done += len(chunk)
        if self.progress is not None:
            self.progress(self.done)


def evaluate_maps(model: nn.Module, x: torch.Tensor, jobs: Sequence[MapJob], *, metrics: Sequence[str],
                  steps: int = 32, batch: int = 64, output_key: str | None = None,
                  original: Sequence[float] | None = None,
                  progress: Callable[[int], None] | None = None,
                  read: Callable[..., list[float]] | None = None) -> tuple[list[MapScores], int]:
    """Scores of each job's map on the batch ``x`` (N, C, H, W), and the forward passes run.
    ``original[j]``: the unperturbed target probability of job j (the confidence metric's Y);
    taken from the deletion curve's first point, or one more input, when not given."""
    import torch

    hw = (int(x.shape[-2]), int(x.shape[-1]))
    n_pix = hw[0] * hw[1]
    x = x.detach()
    scorer = Scorer(model, output_key, batch, progress, len(jobs) * inputs_per_map(metrics, steps), read)
    blurred = fa.gaussian_blur(x.float()).to(x.dtype) if "insertion" in metrics else None
    counts = fa.step_counts(n_pix, steps)
    for j, job in enumerate(jobs):
        xi = x[job.sample]
        gen = torch.Generator().manual_seed(job.seed)
        order = fa.pixel_order(job.saliency, gen)
        if "deletion" in metrics:
            scorer.add((j, "deletion"), fa.causal_inputs(xi, torch.zeros_like(xi), order, counts), job.target)
        if "insertion" in metrics:
            assert blurred is not None
            scorer.add((j, "insertion"), fa.causal_inputs(blurred[job.sample], xi, order, counts), job.target)
        if "road" in metrics:
            # MoRF and LeRF masks in one batch: one multigrid hierarchy build, one solve.
            masks = torch.cat([fa.road_masks(order, hw, fa.ROAD_FRACTIONS, first) for first in (True, False)])
            imputed = fa.impute(xi, masks.to(x.device), noise=fa.ROAD_NOISE, generator=gen)
            k = len(fa.ROAD_FRACTIONS)
            scorer.add((j, "road_morf"), imputed[:k], job.target)
            scorer.add((j, "road_lerf"), imputed[k:], job.target)
        if "confidence" in metrics:
            if original is None:
                scorer.add((j, "original"), xi[None], job.target)
            masked = xi * job.saliency.to(device=x.device, dtype=x.dtype)[None]
            scorer.add((j, "masked"), masked[None], job.target)
    scorer.run()
    while scorer.pending:
        scorer.run()
    out = []
    for j, job in enumerate(jobs):
        res = MapScores()
        got = {name: scorer.probs.get((j, name), []) for name in
               ("deletion", "insertion", "road_morf", "road_lerf", "original", "masked")}
        for name in ("deletion", "insertion"):
            if name in metrics:
                res.curves[name] = got[name]
                res.scores[name] = fa.auc(got[name])
        if "road" in metrics:
            res.curves["road_morf"], res.curves["road_lerf"] = got["road_morf"], got["road_lerf"]
            res.scores.update(fa.road_scores(got["road_morf"], got["road_lerf"]))
        if "confidence" in metrics:
            y = float(original[j]) if original is not None else got["original"][0]
            o = got["masked"][0]
            res.confidence = {"original": y, "masked": o}
            res.scores.update(fa.confidence_change(y, o))
        if job.inside is not None:
            if "pointing" in metrics:
                res.scores["pointing"] = fa.pointing_hit(job.saliency, job.inside)
            if "energy" in metrics:
                res.scores["energy"] = fa.energy_fraction(job.saliency, job.inside)
        out.append(res)
    return out, scorer.passes
