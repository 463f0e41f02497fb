"""Samples of the clip and pair plans: what a shard, a checkpoint and a resumed run count.

An image plan is sharded by its files. A clip plan's unit is a *clip* (a video gives
``--clips`` of them) and a pair plan's a *pair* (two images, or two consecutive frames of a
video clip), so :class:`Samples` lists them before anything is decoded (videos are probed:
their frame counts fix the clips) under the names the batches carry. The runner
(:mod:`inspect_model.run.runner`) takes ``units()``, gives each rank its contiguous block and
a resumed run what is left with ``select(names)``; the plan then reads only those.

A video that cannot be probed is a sample of its own under ``--skip-bad-inputs`` (recorded as
skipped by the one rank whose block holds it), else the error it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspect_model.errors import InputError


@dataclass(frozen=True)
class Sample:
    """One clip (``indices``: its frames) or one pair (``second``: the second image; or, out
    of a video, ``indices``: its two frames); ``error``: why its video cannot be read."""

    name: str
    path: Path
    clip: int = 0
    indices: tuple[int, ...] = ()
    second: Path | None = None
    info: Any = None  # video.VideoInfo
    error: str | None = None


class Samples:
    """The samples of a plan (built once, lazily) and the ones this run reads."""

    def __init__(self, build: Callable[[], list[Sample]]) -> None:
        self.build = build
        self.all: list[Sample] | None = None
        self.only: set[str] | None = None

    def units(self) -> list[str]:
        if self.all is None:
            self.all = self.build()
        return [s.name for s in self.all]

    def select(self, names: list[str] | None) -> None:
        """Read only the samples ``names`` (None: all of them)."""
        self.only = None if names is None else {str(n) for n in names}

    def chosen(self) -> list[Sample]:
        self.units()
        assert self.all is not None
        return [s for s in self.all if self.only is None or s.name in self.only]


def probed(path: Path, skip_bad: bool) -> tuple[Any, str | None]:
    """(VideoInfo, None), or under ``skip_bad`` (None, the reason it cannot be read)."""
    from inspect_model.loading.video import probe

    try:
        return probe(path), None
    except InputError as exc:
        if not skip_bad:
            raise
        return None, str(exc)


def by_clip(samples: list[Sample]) -> Iterator[list[Sample]]:
    """Consecutive samples of one video clip together (its frames are decoded once)."""
    group: list[Sample] = []
    for s in samples:
        if group and (s.path, s.clip, s.info is None) != (group[0].path, group[0].clip, group[0].info is None):
            yield group
            group = []
        group.append(s)
    if group:
        yield group
