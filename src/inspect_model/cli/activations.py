"""``inspect-model activations MODEL [IMAGE ...]``: activation statistics and feature maps."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.shared import RunOptions, run_api, shared_options

EXAMPLE = "inspect-model activations resnet34 cat.jpg --layer type:Conv2d[0] --output-dir acts"

ScaleOpt = Annotated[
    str, typer.Option("--scale", help="Feature-map colours: each (every tile its own min..max) or layer (one scale).")
]
MaxChannelsOpt = Annotated[
    int, typer.Option("--max-channels", help="Draw at most this many channels per layer (0: all).")
]
ChannelsOpt = Annotated[
    str | None,
    typer.Option("--channels", help="Channels to draw: top:N (most active first) or a list like 0,5,8-11."),
]
RawFormatOpt = Annotated[
    str, typer.Option("--raw-format", help="With --save-raw: npy (one file per layer and image) or npz (one per image).")
]



@shared_options(labels=False)
def activations(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    layers: c.LayersOpt = None,
    depth: c.DepthOpt = None,
    scale: ScaleOpt = "layer",
    max_channels: MaxChannelsOpt = 64,
    channels: ChannelsOpt = None,
    colormap: c.ColormapOpt = "viridis",
    save_raw: c.SaveRawOpt = False,
    raw_format: RawFormatOpt = "npy",
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Activation statistics of every layer, and feature-map grids of the layers you name.

    Hooks the selected layers (every leaf by default) for one forward pass per batch and
    reports, per layer and per call: output shape, mean, std, min, max, exact zeros,
    negatives, NaN/Inf counts, and channels dead (zero) for every image, merged over all
    images. With --output-dir: an overview PNG along the depth of the network and, for the
    layers given with --layers, one feature-map grid PNG per layer and image.
    Example: inspect-model activations resnet34 cat.jpg --layer type:Conv2d[0] --output-dir acts
    """
    from inspect_model.api.activations import activations as api_activations
    from inspect_model.api.activations import check_activations_request

    run_opts.check(save_raw=save_raw)
    check_activations_request(scale=scale, raw_format=raw_format, channels=channels,
                                              max_channels=max_channels, colormap=colormap)
    run_api("activations", api_activations, opts, inputs, run_opts, layers=layers, depth=depth,
            scale=scale, max_channels=max_channels, channels=channels, colormap=colormap, save_raw=save_raw,
            raw_format=raw_format)
