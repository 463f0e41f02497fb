"""``inspect-model models [PATTERN]``: list torchvision's model registry."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.cli import common as c


def models(
    pattern: Annotated[str | None, typer.Argument(help="Glob (resnet*) or substring (vit) to filter by.")] = None,
    family: Annotated[
        str | None,
        typer.Option("--family", help="classification, detection, segmentation, video, optical_flow or quantization."),
    ] = None,
    json_: c.JsonOpt = False,
) -> None:
    """List the torchvision models this tool can load by name. Example: inspect-model models 'resnet*'"""
    from inspect_model.errors import UsageError
    from inspect_model.loading.models import FAMILIES, list_models
    from inspect_model.render.jsonout import envelope
    from inspect_model.render.table import Column, plain_table

    if family is not None and family not in FAMILIES:
        raise UsageError(f"--family '{family}' is not one of {', '.join(FAMILIES)}")
    items = [(n, f) for n, f in list_models(pattern) if family is None or f == family]
    cols = (Column("Model"), Column("Family"))
    c.emit(
        as_json=json_,
        json_doc=lambda: envelope(
            "models", {"models": [{"name": n, "family": f} for n, f in items], "count": len(items)},
            options={"pattern": pattern, "family": family},
        ),
        text=lambda: plain_table(cols, [list(i) for i in items]) + f"\n\n{len(items)} models\n",
    )
