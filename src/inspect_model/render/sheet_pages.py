"""Contact sheets in pages, for the drawers of per-image maps (``cam``, ``attributions``).

A drawer collects one sheet row per (image, target) as it draws (``sheet_rows``); a page of
:data:`SHEET_ROWS` rows is drawn on the sink's workers once it is full, and the rest at the
end, so memory stays bounded for any number of images. Each rank numbers its pages from
``rank * RANK_PAGES``; after a merge every rank's pages are renumbered 1, 2, ... in rank
order (:meth:`SheetDrawer.renames`). The pages written and the rows waiting for a page are
part of a run's resumable state. A subclass says how one page is drawn (:meth:`_page`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_model.output.sink import Drawer, Sink

SHEET_ROWS = 16  # rows per contact-sheet page: memory stays bounded for any number of images
RANK_PAGES = 100000  # a rank's pages are numbered from rank * RANK_PAGES, renumbered after the merge


class SheetDrawer(Drawer):
    """A :class:`Drawer` that writes ``contact_sheet_NNN.png`` pages of the rows it collects."""

    photo = False  # the pages are mostly photographs (overlays): see ``png_bytes``

    def __init__(self) -> None:
        self.page_base = 0  # first contact-sheet page number - 1 (another rank's pages come first)
        self.reset()

    def reset(self) -> None:
        self.sheet_rows: list[Any] = []
        self.sheets: list[str] = []

    def start(self, rank: int) -> None:
        self.page_base = rank * RANK_PAGES

    def draw_summary(self, sink: Sink, result: Any) -> None:
        """The last page, the pages' names in the report, and the average faithfulness curves."""
        self._flush_sheet(sink, final=True)
        result.payload["contact_sheets"] = list(self.sheets)
        from inspect_model.render.faithfulness import draw_average_curves

        draw_average_curves(sink, result)

    def no_summary(self, result: Any) -> None:
        result.payload["contact_sheets"] = []

    def flush(self, sink: Sink) -> None:
        self._flush_sheet(sink, final=True)

    # ------------------------------------------------------------------ what a subclass says
    def _page(self, rows: list[Any], page: int) -> Callable[[], Any]:
        """The job that draws page ``page`` of ``rows`` (a PIL image), run on a worker."""
        raise NotImplementedError

    def _sheet_wanted(self) -> bool:
        """Whether the rows make a sheet at all (checked when a page is due)."""
        return True

    def _stored_rows(self, rows: list[Any]) -> list[Any]:
        """``rows`` as the resumable state keeps them (no futures)."""
        return list(rows)

    # ------------------------------------------------------------------ paging
    def _flush_sheet(self, sink: Sink, *, final: bool) -> None:
        """A contact-sheet page when it is full, and at the end (``final``) the rest."""
        if sink.out is None or not self.sheet_rows:
            return
        if not final and len(self.sheet_rows) < SHEET_ROWS:
            return
        if not self._sheet_wanted():
            self.sheet_rows = []
            return
        while self.sheet_rows and (final or len(self.sheet_rows) >= SHEET_ROWS):
            rows, self.sheet_rows = self.sheet_rows[:SHEET_ROWS], self.sheet_rows[SHEET_ROWS:]
            page = self.page_base + len(self.sheets) + 1
            name = sink.image(f"contact_sheet_{page:03d}.png", self._page(rows, page), photo=self.photo)
            if name is not None:
                self.sheets.append(name)

    # ------------------------------------------------------------------ resumable state
    def state_dict(self) -> dict[str, Any]:
        """Pages written and rows waiting for a page."""
        from inspect_model.render.stored_pictures import store

        return {"sheets": list(self.sheets), "sheet_rows": store(self._stored_rows(self.sheet_rows))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from inspect_model.loading.images import MAX_PIXELS
        from inspect_model.render.stored_pictures import restore

        if not isinstance(state["sheet_rows"], list) or len(state["sheet_rows"]) > SHEET_ROWS:
            raise ValueError(f"contact-sheet rows are not a list of at most {SHEET_ROWS}")
        self.sheets = [str(s) for s in state["sheets"]]
        self.sheet_rows = restore(list(state["sheet_rows"]), max_pixels=MAX_PIXELS)

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.sheets = [str(p) for st in states for p in st["sheets"]]

    def renames(self) -> dict[str, str]:
        """Every rank's pages, numbered 1, 2, ... in rank order."""
        new = {old: f"contact_sheet_{i + 1:03d}.png" for i, old in enumerate(self.sheets)}
        self.sheets = list(new.values())
        return new
