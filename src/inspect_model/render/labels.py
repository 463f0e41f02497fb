"""How a target is named in tables, titles and captions: ``281 tabby`` for a class (its index
alone when the model names no classes), the words alone for a named objective of a text or
embedding model (``log p(' mat' | text) at position 5``: its index, always 0, says nothing).
One helper, so the tables, the pictures' titles and report.html agree (issue 35)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def target_label(target: Mapping[str, Any] | Any, *, prefix: str = "") -> str:
    """The words for a target record (its JSON form or the record itself); ``prefix`` goes
    before a class's index (``"class "``), never before an objective's words."""
    t = target if isinstance(target, Mapping) else target.to_dict()
    label = t.get("label")
    if t.get("objective") and label:
        return str(label)
    return f"{prefix}{t.get('class')} {label}" if label else f"{prefix}{t.get('class')}"
