"""The faithfulness records of ``--evaluate`` (issue 40), shared by ``cam``, ``attention`` and
``attributions``: one map's scores and curves (``MapEvaluation``), and the run's settings,
cost and methods ranked on average (``Evaluation``), built by ``run/evaluate.Evaluator``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from inspect_model.reports.base import Record, fact, record
from inspect_model.reports.common import Method, NumberOrNull


@record
class MapConfidence(Record):
    original: NumberOrNull = fact(optional=True)
    masked: NumberOrNull = fact(optional=True)


@record
class MapEvaluation(Record):
    scores: FaithfulnessScores
    curves: FaithfulnessCurves
    confidence: MapConfidence = fact(
        doc="Target probability on the input (original) and on the input times the map (masked); "
            "empty without the confidence metric.")
    rank: float | None = fact(
        doc="Mean rank (1 = best) among the maps of the same image and target rank, over deletion, "
            "insertion, road, drop, increase, pointing, energy; ties share the mean place.")
    steps: dict[str, Annotated[int, {"minimum": 2}]] = fact(
        doc="--eval-steps auto: the steps each curve took.",
        optional=True)


@record
class FaithfulnessScores(Record):
    DEF = "faithfulness_scores"
    CLOSED = True
    SCHEMA = {"description": "Faithfulness scores (--evaluate of cam, attention and attributions). deletion/insertion: AUC of the target probability over the fraction of pixels removed/inserted (Petsiuk et al. 2018; deletion lower is better, insertion higher). road_morf/road_lerf: mean target probability after removing the most/least relevant fraction (ROAD_FRACTIONS) with noisy linear imputation (Rong et al. 2022; MoRF lower, LeRF higher); road: (road_lerf - road_morf) / 2, higher is better. drop: average drop in confidence in percent, lower is better; increase: 100 when the confidence on input x map rose, else 0 (averaged: percent of maps), higher is better (Chattopadhyay et al. 2018). pointing: 1 when the map's maximum lies in a box, else 0 (averaged: accuracy); energy: share of the map's mass inside the boxes (both only with --boxes)."}

    deletion: NumberOrNull = fact(optional=True)
    insertion: NumberOrNull = fact(optional=True)
    road_morf: NumberOrNull = fact(optional=True)
    road_lerf: NumberOrNull = fact(optional=True)
    road: NumberOrNull = fact(optional=True)
    drop: NumberOrNull = fact(optional=True)
    increase: NumberOrNull = fact(optional=True)
    pointing: NumberOrNull = fact(optional=True)
    energy: NumberOrNull = fact(optional=True)


@record
class FaithfulnessCurves(Record):
    DEF = "faithfulness_curves"
    CLOSED = True
    SCHEMA = {"description": "Target probabilities: deletion/insertion at steps+1 evenly spaced fractions 0..1; road_morf/road_lerf at each of road_fractions."}

    deletion: list[NumberOrNull] = fact(optional=True)
    insertion: list[NumberOrNull] = fact(optional=True)
    road_morf: list[NumberOrNull] = fact(optional=True)
    road_lerf: list[NumberOrNull] = fact(optional=True)


@record
class InsertionBlur(Record):
    kernel: int = fact(optional=True)
    sigma: float = fact(optional=True)


@record
class EvaluationAverage(Record):
    method: Method
    layer: str
    maps: int = fact(minimum=1)
    scores: FaithfulnessScores
    curves: FaithfulnessCurves
    rank: float | None = fact(doc="Mean rank over the averaged scores (1 = best).")
    mean_image_rank: float | None = fact(doc="The mean of this method's per-image ranks.")


@record
class Evaluation(Record):
    metrics: list[Literal["deletion", "insertion", "road", "confidence", "pointing", "energy"]]
    steps: Any = fact(
        doc="--eval-steps: steps of the deletion/insertion curves, or auto (each curve's own, in its "
            "map's evaluation.steps).",
        schema={"anyOf": [{"type": "integer", "minimum": 2}, {"const": "auto"}]})
    batch: int = fact(doc="--eval-batch: perturbed inputs per forward pass.", minimum=1)
    road_fractions: list[float] = fact(doc="Fractions of pixels removed by ROAD.")
    road_noise: float = fact(doc="Std of the noise added to imputed pixels.")
    insertion_blur: InsertionBlur = fact(doc="The Gaussian blur insertion starts from.")
    boxes: str | None = fact(doc="The --boxes file.")
    passes: int = fact(doc="Forward passes run for the evaluation.", minimum=0)
    inputs: int = fact(doc="Perturbed inputs scored.", minimum=0)
    average: list[EvaluationAverage] = fact(doc="One row per method and layer, best rank first.")
    plots: list[str] = fact(doc="evaluation_curves.png: the mean curves (with --output-dir).")
    tolerance: float = fact(
        doc="--eval-steps auto: the AUC change at which a curve stops refining.",
        optional=True)
