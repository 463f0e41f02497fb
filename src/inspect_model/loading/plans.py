"""The input-plan protocol (issue 35): what the runner, the pipeline and the sessions ask of
every input plan, in place of ``hasattr(plan, ...)`` probes.

Every plan (images, tensors, texts, clips, flow pairs, prompt pairs) derives from
:class:`Plan` and keeps what it does not change: its units are its ``paths`` (clip and pair
plans: their samples by name), selecting a subset reads only those, a report entry gets no
extra record, and decoding workers are a no-op.
"""

from __future__ import annotations

from typing import Any


class Plan:
    """The base of every input plan (a mixin of the plans' dataclasses: methods only, no
    fields, so the dataclasses' own fields and defaults stay as they are)."""

    unit = "image"  # what one unit is called in progress lines ("3/10 texts")

    def units(self) -> list[Any]:
        """What a run shards, counts and resumes by: the image files by default."""
        return list(getattr(self, "paths", None) or [])

    def select(self, chosen: list[Any] | None) -> None:
        """Read only ``chosen`` of the units from now on (None: all of them again)."""
        full = self.__dict__.setdefault("_all_units", self.units())
        self.paths = list(full if chosen is None else chosen)  # type: ignore[attr-defined]

    def extra_record(self, name: str) -> dict[str, Any]:
        """Keys a report entry named ``name`` gets from its input (a clip's or pair's record)."""
        return {}

    def use_workers(self, workers: int) -> None:
        """Decode in ``workers`` processes where the plan can (image files); else nothing."""
