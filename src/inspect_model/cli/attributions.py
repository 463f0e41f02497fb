"""``inspect-model attributions MODEL IMAGE ...``: saliency, gradient, input x gradient,
integrated gradients, SmoothGrad, VarGrad, occlusion and guided backprop maps."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.shared import RunOptions, run_api, shared_options

EXAMPLE = ("inspect-model attributions resnet50 cat.jpg --method saliency --method integrated-gradients "
           "--steps 64 -o attr")

MethodOpt = Annotated[
    list[str] | None,
    typer.Option("--method", "-m", help="saliency, gradient, input-x-gradient, integrated-gradients, smoothgrad, "
                 "vargrad, occlusion, guided, or all; repeatable or comma-separated (default: saliency)."),
]
StepsOpt = Annotated[int, typer.Option("--steps", help="integrated-gradients: points on the path.")]
RuleOpt = Annotated[
    str, typer.Option("--rule", help="integrated-gradients: gauss-legendre, riemann-left, riemann-right, "
                      "riemann-middle or riemann-trapezoid.")
]
BaselineOpt = Annotated[
    str, typer.Option("--baseline", help="integrated-gradients and occlusion: zeros, blur, blur:SIGMA (pixels), "
                      "uniform (seeded), a number, or a .pt/.npy file of one input's shape.")
]
SamplesOpt = Annotated[int, typer.Option("--samples", help="smoothgrad, vargrad, --smooth: noisy copies per input.")]
NoiseOpt = Annotated[
    float, typer.Option("--noise", help="Noise standard deviation: a fraction of each input's value range "
                        "(SmoothGrad: 0.1-0.2), or absolute with --noise-mode absolute.")
]
NoiseModeOpt = Annotated[str, typer.Option("--noise-mode", help="fraction (of the input's range) or absolute.")]
WindowOpt = Annotated[
    str, typer.Option("--window", help="occlusion: window size, 16 (16x16 over all channels), 16,24 or 3,16,16; "
                      "on token embeddings, tokens.")
]
StrideOpt = Annotated[str | None, typer.Option("--stride", help="occlusion: window step (default: half the window).")]
SmoothOpt = Annotated[
    bool, typer.Option("--smooth", help="Average every gradient method over --samples noisy copies "
                       "(SmoothGrad around it, as captum's NoiseTunnel).")
]
ActivationsOpt = Annotated[
    bool, typer.Option("--activations", help="guided: also guide relu6, leaky_relu, silu, gelu and prelu.")
]
SanityOpt = Annotated[
    bool, typer.Option("--sanity", help="Cascading weight randomisation (Adebayo et al. 2018) on a copy of the "
                       "model, for every method: Spearman rank correlation with the original maps.")
]
EvaluateOpt = Annotated[
    bool, typer.Option("--evaluate", help="Score every map's faithfulness (deletion/insertion AUC, ROAD, "
                       "confidence) and rank the methods, as cam --evaluate.")
]
MetricOpt = Annotated[
    list[str] | None, typer.Option("--metric", help="With --evaluate: deletion, insertion, road, confidence or "
                                   "all (default); repeatable."),
]
EvalStepsOpt = Annotated[int, typer.Option("--eval-steps", help="Steps of the deletion and insertion curves.")]
EvalBatchOpt = Annotated[int, typer.Option("--eval-batch", help="Perturbed inputs per forward pass (--evaluate).")]
OverlaysOpt = Annotated[
    bool, typer.Option("--overlays/--no-overlays", help="With --output-dir: maps blended over the original image.")
]


@shared_options()
def attributions(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    method: MethodOpt = None,
    target: c.TargetOpt = "predicted",
    steps: StepsOpt = 32,
    rule: RuleOpt = "gauss-legendre",
    baseline: BaselineOpt = "zeros",
    samples: SamplesOpt = 16,
    noise: NoiseOpt = 0.15,
    noise_mode: NoiseModeOpt = "fraction",
    window: WindowOpt = "16",
    stride: StrideOpt = None,
    smooth: SmoothOpt = False,
    activations: ActivationsOpt = False,
    output_key: c.OutputKeyOpt = None,
    evaluate: EvaluateOpt = False,
    metric: MetricOpt = None,
    eval_steps: EvalStepsOpt = 32,
    eval_batch: EvalBatchOpt = 64,
    sanity: SanityOpt = False,
    save_raw: c.SaveRawOpt = False,
    overlays: OverlaysOpt = True,
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Input attributions: saliency, gradient, input x gradient, integrated gradients,
    SmoothGrad, VarGrad, occlusion and guided backprop, equal to captum's.

    Integrated-gradients steps, SmoothGrad samples and occlusion windows run through the model
    in chunks of --batch-size rows (memory does not grow with --steps or --samples); saliency,
    gradient and input x gradient share one backward pass. Token ids are attributed at the
    output of the embedding layer that reads them. With --output-dir: per map a heat map
    (signed maps on a diverging colormap centred on 0) and an overlay, contact sheets of
    images x methods, and in the report each map's positive and negative mass and, for
    integrated gradients, the completeness gap.

    Example: inspect-model attributions resnet50 cat.jpg --method saliency --method integrated-gradients --steps 64 -o attr
    """
    from inspect_model.api.attributions import AttributionsRequest
    from inspect_model.api.attributions import attributions as api_attributions

    run_opts.check(save_raw=save_raw)
    request = AttributionsRequest(
        methods=tuple(method or ["saliency"]), target=target, steps=steps, rule=rule, baseline=baseline,
        samples=samples, noise=noise, noise_mode=noise_mode, window=window, stride=stride, smooth=smooth,
        activations=activations, output_key=output_key, evaluate=evaluate,
        metrics=tuple(metric) if metric else None, eval_steps=eval_steps, eval_batch=eval_batch, sanity=sanity,
        save_raw=save_raw, overlays=overlays)
    run_api("attributions", api_attributions, opts, inputs, run_opts, request=request)
