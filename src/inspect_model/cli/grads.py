"""``inspect-model grads MODEL [IMAGE ...]``: gradient flow, health checks for CI, and
gradients between inner layers (``--of A --wrt B``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.shared import RunOptions, run_api, shared_options

EXAMPLE = "inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding --output-dir g"

GradTargetOpt = Annotated[
    str | None,
    typer.Option("--target", "-t", help="Differentiate a class score: predicted (default), a class index or "
                 "name, or top:K (the sum of the K best scores), as output.backward(one_hot)."),
]
LossOpt = Annotated[
    str | None,
    typer.Option("--loss", help="Differentiate a loss instead, summed over inputs: cross-entropy (needs "
                 "--label/--labels-file), mse (against the label's one-hot, or zeros without a label), "
                 "or sum (of every output element)."),
]
LabelOpt = Annotated[str | None, typer.Option("--label", help="True class (index or name) of every input, for --loss.")]
LabelsFileOpt = Annotated[
    Path | None, typer.Option("--labels-file", help="One true class per image (index or name per line), for --loss.")
]
ClipNormOpt = Annotated[
    float | None, typer.Option("--clip-norm", help="Report what clip_grad_norm_(max_norm=X) would do.")
]
VanishingOpt = Annotated[
    float, typer.Option("--vanishing-below", help="Vanishing: a layer's output-gradient norm / the largest layer's "
                        "is below this.")
]
ExplodingOpt = Annotated[
    float, typer.Option("--exploding-above", help="Exploding: a layer's output-gradient norm / the model "
                        "output's gradient norm is above this.")
]
FailOnOpt = Annotated[
    str | None, typer.Option("--fail-on", help="Exit 1 if one of these checks fails: nan,inf,vanishing,exploding "
                                "(comma-separated) or all.")
]
OfOpt = Annotated[
    str | None, typer.Option("--of", help="Gradient of: a layer's output (ones vector), 'output' (the model "
                                "output) or 'score' (the --target score). Default with --wrt: score.")
]
WrtOpt = Annotated[
    str | None, typer.Option("--wrt", help="... with respect to: a layer's output or 'input'. Default with --of: input.")
]
JacNormOpt = Annotated[
    bool, typer.Option("--jacobian-norm", help="Estimate ||d(of)/d(wrt)||_F with Gaussian probes, with its standard error.")
]
ProbesOpt = Annotated[int, typer.Option("--probes", help="Number of random probes for --jacobian-norm.")]



@shared_options()
def grads(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    target: GradTargetOpt = None,
    loss: LossOpt = None,
    label: LabelOpt = None,
    labels_file: LabelsFileOpt = None,
    output_key: c.OutputKeyOpt = None,
    layers: c.LayersOpt = None,
    depth: c.DepthOpt = None,
    clip_norm: ClipNormOpt = None,
    vanishing_below: VanishingOpt = 1e-5,
    exploding_above: ExplodingOpt = 1e4,
    fail_on: FailOnOpt = None,
    of: OfOpt = None,
    wrt: WrtOpt = None,
    jacobian_norm: JacNormOpt = False,
    probes: ProbesOpt = 16,
    score_threshold: c.ScoreThresholdOpt = None,
    max_detections: c.MaxDetectionsOpt = 10,
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Gradient flow and gradient health: per layer the gradient wrt its output and wrt its
    input, per parameter its gradient statistics, the global norm, clipping, and NaN/Inf,
    vanishing and exploding checks (--fail-on makes a failed check exit 1 for CI).
    With --of/--wrt: d(A)/d(B) between inner layers, and --jacobian-norm.
    Example: inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding --output-dir g
    """
    from inspect_model.errors import UsageError

    if label is not None and labels_file is not None:
        raise UsageError("--label and --labels-file both give labels; choose one")
    from inspect_model.api.grads import check_grads_request
    from inspect_model.api.grads import grads as api_grads

    run_opts.check()
    check_grads_request(
        target=target, loss=loss, label=label, labels_file=labels_file, clip_norm=clip_norm,
        vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on, layers=layers, of=of,
        wrt=wrt, jacobian_norm=jacobian_norm, probes=probes, tensorboard=run_opts.tensorboard)
    run_api("grads", api_grads, opts, inputs, run_opts, target=target, loss=loss, label=label,
            labels_file=labels_file, output_key=output_key, layers=layers, depth=depth, clip_norm=clip_norm,
            vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on, of=of, wrt=wrt,
            jacobian_norm=jacobian_norm, probes=probes, score_threshold=score_threshold,
            max_detections=max_detections)
