"""The files of ``attributions --generate`` (issue 36): per text (``images/NNNN-<name>/``)
``generation.<method>.png``, the tokens x tokens matrix with token labels on both axes
(:func:`inspect_model.render.generation.matrix_figure`)."""

from __future__ import annotations

from typing import Any

from inspect_model.output.files import image_dir
from inspect_model.output.sink import Drawer, Sink


class GenerationDrawer(Drawer):
    """Draws one matrix per method from an entry's ``generation`` record alone."""

    def __init__(self, *, methods: list[str]) -> None:
        self.methods = methods

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.render.generation import matrix_figure

        entry = item.entry
        if sink.out is None:
            return entry.get("files", {})
        gen = entry["generation"]
        base = image_dir(entry["index"], entry["image"])
        objective = "log p(token | prefix)" + (f" - log p({gen['contrast']['token']!r})" if gen.get("contrast")
                                               else "")
        files = {}
        signed = {m["method"]: bool(m.get("signed", True)) for m in entry.get("maps") or []}
        for method in gen["matrices"]:
            what = "greedy continuation" if gen["mode"] == "greedy" else "continuation given"
            shown = gen["text"] if len(gen["text"]) <= 60 else gen["text"][:59] + "…"
            title = f"{method}: {objective}\n{entry['image']}: {what} {shown!r}"
            name = sink.figure(f"{base}/generation.{method}.png",
                               matrix_figure(gen, method, signed=signed.get(method, True), title=title))
            if name:
                files[f"generation.{method}"] = name
        return files
