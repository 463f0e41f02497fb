"""``inspect-model models [PATTERN]``: list torchvision's model registry, or timm's (``--source timm``)."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.cli import console
from inspect_model.registry import command_cli
from inspect_model.cli import options as c


@command_cli("models")
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
    from inspect_model.api.models import models as api_models
    from inspect_model.output.jsonout import envelope

    result = api_models(None, pattern=pattern, family=family, source=source)
    console.emit(
        as_json=json_,
        json_doc=lambda: envelope("models", result.payload, options=result.options),
        text=result.text,
    )
