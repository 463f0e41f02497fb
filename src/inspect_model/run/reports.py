"""The run's reports: ``report.txt``, ``report.json`` and ``report.html``, written through the
sink after every other file (they list them). Kept out of :mod:`inspect_model.output`, which
writes bytes and knows no renderer.
"""

from __future__ import annotations

from typing import Any

from inspect_model.output.sink import Sink
from inspect_model.render.table import clean


def write_reports(result: Any, sink: Sink) -> None:
    """report.txt, report.json and report.html, after every other file (they list them)."""
    import json

    from inspect_model.render.html import render_html
    from inspect_model.output.jsonout import dumps

    result.files = sorted({*sink.written(), "report.txt", "report.json", "report.html"})
    sink.text("report.txt", clean(result.text()))  # JSON keeps exact strings; text is for terminals
    doc = dumps(result.to_dict())
    sink.text("report.json", doc + "\n")
    sink.text("report.html", render_html(json.loads(doc)))
