"""``inspect-model models [PATTERN]``: list torchvision's model registry, or timm's (``--source timm``)."""

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
    source: Annotated[
        str, typer.Option("--source", help="torchvision, or timm (NAME.TAG patterns list pretrained weights).")
    ] = "torchvision",
    json_: c.JsonOpt = False,
) -> None:
    """List the models this tool can load by name. Example: inspect-model models 'resnet*'; inspect-model models --source timm 'convnext*'"""
    from inspect_model.errors import UsageError
    from inspect_model.loading.sources.torchvision import FAMILIES, list_models
    from inspect_model.render.jsonout import envelope
    from inspect_model.render.table import Column, plain_table

    if source not in ("torchvision", "timm"):
        raise UsageError(f"--source '{source}' is not one of torchvision, timm")
    if family is not None and family not in FAMILIES:
        raise UsageError(f"--family '{family}' is not one of {', '.join(FAMILIES)}")
    if source == "timm":
        if family is not None:
            raise UsageError("--family applies to torchvision's models; timm's are listed by PATTERN")
        from inspect_model.loading.sources.timm import list_timm

        items = list_timm(pattern)
    else:
        items = [(n, f) for n, f in list_models(pattern) if family is None or f == family]
    cols = (Column("Model"), Column("Family"))
    c.emit(
        as_json=json_,
        json_doc=lambda: envelope(
            "models", {"models": [{"name": n, "family": f} for n, f in items], "count": len(items)},
            options={"pattern": pattern, "family": family, "source": source},
        ),
        text=lambda: plain_table(cols, [list(i) for i in items]) + f"\n\n{len(items)} models\n",
    )
