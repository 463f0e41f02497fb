"""Hooks of the pipeline for video and optical-flow models (issue 25), kept apart so that
the runner stays about images: a pair model's binding and its one target, the clip / pair
records of each report entry, and the flow picture of each pair. No import of the pipeline
(what it needs comes in as arguments): no circle in api/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any



def media_binding(command: str, loaded: Any, plan: Any, binding: Any, categories: Any,
                   notes: Callable[[str], None] | None, *, objective: bool = False) -> tuple[Any, Any]:
    """A pair model's plan brings its own binding (the second images); for a command that
    explains a score (``objective``, from its registry entry) it scores the mean flow
    magnitude, the one 'class' (loading/pairs.py)."""
    from inspect_model.loading.pairs import FLOW_TARGET, PairBinding

    if not isinstance(getattr(plan, "binding", None), PairBinding):  # image pairs, frame pairs, tensor pairs
        return binding, categories
    plan.binding.objective = objective
    if notes is not None:
        what = f"; explained: {FLOW_TARGET} (|flow| averaged) of the final prediction, w.r.t. the first image" \
            if plan.binding.objective else ""
        notes(f"a flow model: inputs are pairs (first image, second image){what}")
    return plan.binding, [FLOW_TARGET] if plan.binding.objective else categories


def media_records(session: Any, item: Any) -> None:
    """A clip's video, clip and frame indices and times (``clip``), or a flow sample's two
    images (``pair``), in its report entry and in each of its maps (loading/clips.py, pairs.py)."""
    plan = getattr(getattr(session, "prep", None), "plan", None)
    extra = plan.extra_record(str(item.entry.get("image"))) if plan is not None else {}
    if not extra:
        return
    item.entry.update(extra)
    clip = extra.get("clip")
    for rec in item.entry.get("maps", []) if clip is not None else []:
        if isinstance(rec, dict):
            rec["clip"], rec["frames"], rec["times"] = clip["clip"], clip["frames"], clip["times"]


def flow_file(session: Any, item: Any, sink: Any, folder: Callable[[int, str], str]) -> None:
    """A flow model's prediction for the pair as a picture (torchvision's flow_to_image)."""
    binding = getattr(getattr(session, "prep", None), "binding", None)
    if sink.out is None or not hasattr(binding, "flow_picture"):
        return
    picture = binding.flow_picture(str(item.entry.get("image")))
    if picture is not None and "index" in item.entry:
        files = item.entry.setdefault("files", {})
        name = sink.image(f"{folder(item.entry['index'], str(item.entry['image']))}/flow.png", picture)
        if isinstance(files, dict) and name:
            files["flow"] = name


def flow_boxes(prep: Any, boxes: Any, notes: Callable[[str], None]) -> None:
    """``cam --boxes`` without ``--evaluate``: for a flow model the score becomes the mean flow
    magnitude inside each pair's boxes (given in its first image's pixels); any other model
    needs ``--evaluate`` for boxes."""
    from inspect_model.errors import UsageError
    from inspect_model.loading.boxes import load_boxes, match_boxes

    binding = getattr(prep, "binding", None)
    if not hasattr(binding, "boxes"):
        raise UsageError("--boxes needs --evaluate (a flow model takes it alone: the region whose flow is explained)")
    names = [str(p) for p in prep.plan.paths]
    binding.boxes = match_boxes(load_boxes(boxes), names, str(boxes))
    notes(f"--boxes: the mean flow magnitude inside the boxes of {len(binding.boxes)} pair(s) is explained")
