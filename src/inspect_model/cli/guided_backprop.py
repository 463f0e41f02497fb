"""``inspect-model guided-backprop MODEL IMAGE ...``: guided backpropagation maps per image and target."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.shared import RunOptions, run_api, shared_options

EXAMPLE = "inspect-model guided-backprop resnet50 cat.jpg --target top:3 --output-dir gb"

ActivationsOpt = Annotated[
    bool,
    typer.Option("--activations", help="Also guide relu6, leaky_relu, silu, gelu and prelu "
                 "(clamp the negative gradient at their outputs)."),
]
GuidedGradcamOpt = Annotated[
    bool, typer.Option("--guided-gradcam", help="Also write guided backprop times the Grad-CAM map of --layer.")
]
LayerOpt = Annotated[
    str, typer.Option("--layer", "-l", help="Grad-CAM layer for --guided-gradcam: auto or a layer spec.")
]
SanityOpt = Annotated[
    bool,
    typer.Option("--sanity", help="Cascading weight-randomisation check (Adebayo et al. 2018) on a copy "
                 "of the model; reports Spearman rank correlation with the original maps."),
]
OverviewOpt = Annotated[
    bool, typer.Option("--overview/--no-overview", help="With --output-dir: one titled overview PNG per image.")
]


@shared_options()
def guided_backprop(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    target: c.TargetOpt = "predicted",
    activations: ActivationsOpt = False,
    guided_gradcam: GuidedGradcamOpt = False,
    layer: LayerOpt = "auto",
    sanity: SanityOpt = False,
    output_key: c.OutputKeyOpt = None,
    save_raw: c.SaveRawOpt = False,
    overview: OverviewOpt = True,
    score_threshold: c.ScoreThresholdOpt = None,
    max_detections: c.MaxDetectionsOpt = 10,
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Guided backpropagation (Springenberg et al. 2015) for any network.

    Every ReLU of the model (modules, in-place ones, reused ones, and functional F.relu /
    torch.relu calls) passes back only positive gradient where its input was positive. One
    map per image and target: a display PNG, a grayscale magnitude PNG, and with --save-raw
    the raw gradient (.npy). Example: inspect-model guided-backprop resnet50 cat.jpg --target top:3 --output-dir gb
    """
    from inspect_model.api.guided import check_guided_request
    from inspect_model.api.guided import guided_backprop as api_guided_backprop

    run_opts.check(save_raw=save_raw)
    check_guided_request(layer=layer, guided_gradcam=guided_gradcam, output_key=output_key)
    run_api("guided-backprop", api_guided_backprop, opts, inputs, run_opts, target=target,
            activations=activations, guided_gradcam=guided_gradcam, layer=layer, sanity=sanity,
            output_key=output_key, save_raw=save_raw, overview=overview, score_threshold=score_threshold,
            max_detections=max_detections)
