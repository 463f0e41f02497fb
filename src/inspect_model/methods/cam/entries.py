"""The ``cam`` report's per-image entry, built from a :class:`~inspect_model.methods.cam.maps.CamResult`
as typed records (:mod:`inspect_model.reports.cam`): what ``--json`` lists and ``--jsonl``
streams. The session builds these; render/ only formats them (issue 35: the entries were
built in render/ and called back from the session)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.objectives.rows import class_name, objective_flag
from inspect_model.reports.cam import CamImage, CamImageFiles, CamMap, CamMapFiles, ClassScore

if TYPE_CHECKING:
    from inspect_model.methods.cam.maps import CamResult


def image_entry(res: CamResult, i: int, *, index: int, name: str, size: list[int] | None,
                categories: list[str] | None, top: int = 5) -> CamImage:
    """The report entry of sample ``i`` of ``res`` (global position ``index``): its top
    predictions, its targets and one :class:`CamMap` per map of the sample."""
    import torch

    scores = res.scores[i]
    probs = res.probabilities[i]

    def score(c: int) -> ClassScore:
        return ClassScore(class_=c, label=class_name(c, categories), score=float(scores[c]),
                          probability=float(probs[c]), **objective_flag(categories))

    k = min(top, scores.shape[0])
    # Ranked by the scores, equal ones lowest class first: the ranking of the targets
    # (methods.objectives.targets.top_classes), so the first class is the one 'predicted' draws.
    best = torch.sort(scores.detach().float(), descending=True, stable=True).indices[:k].tolist()
    maps = [CamMap(method=m.method, layer=m.layer, rank=m.rank, target=score(m.target),
                   class_independent=m.class_independent, raw_min=m.raw_min, raw_max=m.raw_max,
                   warnings=list(m.warnings), files=CamMapFiles())
            for m in res.maps if m.sample == i]
    return CamImage(index=index, image=name, size=size, predictions=[score(int(c)) for c in best],
                    targets=[int(t) for t in res.targets[i]], maps=maps, files=CamImageFiles())
