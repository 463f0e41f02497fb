"""A text row of the attributions contact sheet shows its tokens in the input column, one per
cell of the map strips beside it (it was an empty column)."""

from __future__ import annotations

import numpy as np

from inspect_model.render import attributions as ra
from inspect_model.render.overlay import THUMB


def test_tokens_sit_under_cells_as_wide_as_the_strips() -> None:
    img = np.asarray(ra.sheet_tokens(["the", "cat", "sat"]).convert("L"))
    assert img.shape[1] == THUMB  # as wide as a map strip (sheet_cell)
    strip, text = img[:24], img[24:]
    assert (strip < 255).all(axis=0).any()  # the cells are drawn
    ink = text < 128
    assert ink.any()
    cols = np.nonzero(ink.any(axis=0))[0]
    thirds = {int(c * 3 // THUMB) for c in cols}
    assert thirds == {0, 1, 2}  # a word under each of the three cells


def test_many_tokens_get_cells_without_words() -> None:
    img = np.asarray(ra.sheet_tokens(["<unk>"] * 40).convert("L"))
    assert img.shape == (24, THUMB)  # no unreadable labels under 4-pixel cells


def test_a_text_run_draws_its_tokens_in_the_input_column(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from inspect_model.render.draw_attributions import AttributionsDrawer

    seen: list[object] = []
    drawer = AttributionsDrawer(categories=None, preprocess=None, methods=["saliency"], save_raw=False,
                                overlays=False, curves=False)
    drawer._flush_sheet = lambda sink, final: seen.extend(drawer.sheet_rows)  # type: ignore[method-assign]

    class Sink:
        out = tmp_path

        def image(self, name, draw, photo=False):  # type: ignore[no-untyped-def]
            return name

    import torch

    class Item:
        entry = {"index": 0, "image": "text-0", "text": {"tokens": ["the", "cat"]},
                 "maps": [{"rank": 0, "method": "saliency", "signed": False, "smoothed": False, "sum": 1.0,
                           "target": {"class": 3, "label": "the", "score": 1.0}}]}
        data = (None, torch.zeros(2, 8), {"saliency": torch.rand(1, 1, 2)})

    drawer.draw(Item(), Sink())  # type: ignore[arg-type]
    label, picture, cells = seen[0]  # type: ignore[misc]
    assert picture is not None and picture.size[0] == THUMB
