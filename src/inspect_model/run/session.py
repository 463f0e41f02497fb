"""What every image command is: a :class:`Session` fed batches, giving :class:`ImageItem`
records and, at the end, a :class:`Result`.

A session computes; it draws nothing (its ``drawer``, from ``render/``, turns its records
into files). A session that can be spread over processes (torchrun) or resumed
(``--resume``) says so through a small protocol, as torch's ``Optimizer`` does:
``start(index, batch, rank)`` (this process runs the block that begins at run index
``index``), ``state_dict()`` / ``load_state_dict(state)`` (what a checkpoint keeps),
``merge(states)`` (every rank's state, in rank order, on rank 0), ``reduce(group)``
(collectives before the gather) and ``resolved_options()`` (what the report's ``options``
holds: the ``--resume`` fingerprint). :func:`inspect_model.run.runner.run` drives them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import OutputError, UsageError
from inspect_model.output.jsonout import envelope

if TYPE_CHECKING:
    from inspect_model.loading.inputs import InputBatch
    from inspect_model.output.sink import Drawer

MAX_WARNINGS = 200  # distinct warnings kept; more are counted, not listed


class Warnings:
    """The one warning policy: identical warnings collapse into one entry with a count,
    in the order first seen; at most :data:`MAX_WARNINGS` distinct ones are kept."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self.dropped = 0

    def add(self, text: str, count: int = 1) -> None:
        text = " ".join(str(text).split())
        if text in self._counts:
            self._counts[text] += count
        elif len(self._counts) < MAX_WARNINGS:
            self._counts[text] = count
        else:
            self.dropped += count

    def extend(self, texts: Iterable[str]) -> None:
        for t in texts:
            self.add(t)

    def merge(self, others: Iterable[Warnings]) -> None:
        """Add the warnings of ``others`` (other ranks' or runs'), counts summed."""
        for w in others:
            for text, count in w._counts.items():
                self.add(text, count)
            self.dropped += w.dropped

    def __len__(self) -> int:
        return len(self._counts)

    def to_list(self) -> list[dict[str, Any]]:
        out = [{"message": m, "count": c} for m, c in self._counts.items()]
        if self.dropped:
            out.append({"message": f"{self.dropped} more warning(s) not listed", "count": self.dropped})
        return out


def warning_lines(items: list[dict[str, Any]]) -> list[str]:
    """Warnings as the one-line texts stderr shows: ``text (x15)`` for repeats."""
    return [w["message"] + (f" (x{w['count']})" if w["count"] > 1 else "") for w in items]


def input_outcome(plan: Any, warnings: Warnings) -> list[dict[str, str]]:
    """What the inputs gave: each skipped file becomes a warning and the report's
    ``skipped`` list (the same in every command), and the plan's per-image notes warnings."""
    skipped = [{"path": str(p), "reason": r} for p, r in getattr(plan, "skipped", [])]
    for s in skipped:
        warnings.add(f"skipped '{s['path']}': {s['reason']}")
    warnings.extend(getattr(plan, "warnings", []))
    return skipped


@dataclass
class ImageItem:
    """One input's share of a result: its report entry and what its files are drawn from."""

    entry: dict[str, Any]
    data: Any = None  # what the drawer needs for the files (dropped once drawn)


@dataclass
class Result:
    """What a command produced: everything its reports hold, as data.

    ``to_dict()`` is the ``--json`` document; ``text()``/``rich()`` the report on stdout,
    drawn by the renderer its command's registry entry names (``view``: a variant it reads);
    ``save(dir)`` writes the command's files. Attributes of the method's record
    (``record``) are reachable directly: ``im.summary(...).total_params``."""

    command: str
    options: dict[str, Any]
    payload: dict[str, Any]
    warnings: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # failed checks: exit 1 on the CLI
    record: Any = None
    view: str = ""  # a variant of the command's report its renderer reads ("grads-jacobian")
    session: Any = None  # to draw the files again (save)
    items: list[ImageItem] | None = None

    def __getattr__(self, name: str) -> Any:
        record = self.__dict__.get("record")
        if record is not None and not name.startswith("_"):
            return getattr(record, name)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        body = {**self.payload, "warnings": list(self.warnings)}
        return envelope(self.command, body, options=self.options, files=self.files)

    def text(self) -> str:
        from inspect_model.render.results import result_text

        return result_text(self.command, self)

    def rich(self) -> list[Any]:
        from inspect_model.render.results import result_rich

        return result_rich(self.command, self)

    def save(self, directory: str | os.PathLike[str], *, force: bool = False) -> list[str]:
        """Write the command's files into ``directory``: all of them or, on failure, none."""
        from inspect_model.output.files import OutputDir
        from inspect_model.output.sink import Sink
        from inspect_model.run.reports import write_reports

        drawer = getattr(self.session, "drawer", None)
        if self.items is None and self.session is not None and getattr(self.session, "streams_files", False):
            raise OutputError("this result was computed without keeping its maps; pass output_dir= to the "
                              "API call (or keep=True) to write its files")
        with OutputDir(directory, force=force) as out:
            sink = Sink(out)
            try:
                if drawer is not None:
                    drawer.reset()
                    for item in self.items or []:
                        item.entry["files"] = drawer.draw(item, sink)
                    drawer.draw_summary(sink, self)
                if getattr(self.session, "report_from_records", False):
                    self._rebuild()  # the report's records name the files just drawn
                sink.drain()
                write_reports(self, sink)
            finally:
                sink.close(cancel=True)
        return list(self.files)

    def _rebuild(self) -> None:
        """The payload and record again from the session, whose entries now name their files
        (a session whose report is typed records built in ``finish``; warnings kept as they are)."""
        fresh = self.session.finish()  # what the run added after finish() (its throughput) stays
        self.payload, self.record = {**self.payload, **fresh.payload}, fresh.record


class Session:
    """A command's streaming computation: ``feed`` each batch, then ``finish``; files are
    its ``drawer``'s (a :class:`inspect_model.output.sink.Drawer`, or None: no files)."""

    command = ""
    streams_files = False  # per-image files, drawn from data that is dropped once drawn
    report_from_records = False  # finish() builds the report's records from the entries: save() builds it again
    index_base = 0  # run index of the first image fed (a shard or a resumed run starts later)
    drawer: Drawer | None = None
    prep: Any = None  # api.pipeline.Prepared: the model, the input plan
    notes: Callable[[str], None] | None = None

    def feed(self, batch: InputBatch) -> list[ImageItem]:
        raise NotImplementedError

    def run(self, batches: Iterable[InputBatch], handle: Callable[[ImageItem], None]) -> None:
        """Feed every batch, handing each item on as soon as it exists."""
        for batch in batches:
            for item in self.feed(batch):
                handle(item)

    def finish(self) -> Result:
        raise NotImplementedError

    def line(self, item: ImageItem) -> dict[str, Any]:
        """The ``--jsonl`` object of one item."""
        return item.entry

    # ------------------------------------------------------------------ the protocol
    def resolved_options(self) -> dict[str, Any]:
        """The report's ``options``: every option as resolved (the ``--resume`` fingerprint).
        By default the model and input options and the command's request as given."""
        request, prep = getattr(self, "request", None), getattr(self, "prep", None)
        if request is None or prep is None:
            return {}
        return prep.options(getattr(self, "mopts", None), **request.resolved())

    def check_scalable(self, what: str) -> None:
        """Raise :class:`UsageError` if this session cannot run under ``what`` (``--resume``,
        ``torchrun``): it has no state to keep or merge."""
        from inspect_model.registry import capability, with_capability

        if not capability(self.command, "resumable", True) or type(self).state_dict is Session.state_dict:
            raise UsageError(f"{self.command} does not support {what} yet; "
                             f"{', '.join(with_capability('resumable'))} do")

    def start(self, index: int, batch: int, rank: int) -> None:
        """This process runs the block of images from run index ``index`` (batch ``batch``) as rank ``rank``."""
        self.index_base = index
        if self.drawer is not None:
            self.drawer.start(rank)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps and a rank hands to rank 0 (plain data and our records)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def merge(self, states: list[dict[str, Any]]) -> None:
        """Every rank's :meth:`state_dict`, in rank order, into this (rank 0's) session."""
        raise NotImplementedError

    def reduce(self, group: Any) -> None:
        """Collectives every rank joins before the gather (grads: summed parameter gradients)."""
