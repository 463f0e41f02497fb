"""``inspect-model attention MODEL IMAGE ...``: what a vision transformer attends to."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.cam import BoxesOpt, EvalBatchOpt, EvalStepsOpt, EvaluateOpt, MetricOpt
from inspect_model.cli.shared import RunOptions, run_api, shared_options

EXAMPLE = "inspect-model attention vit_b_16 cat.jpg --method rollout,grad-rollout,legrad --output-dir attn"

MethodOpt = Annotated[
    list[str] | None,
    typer.Option("--method", "-m", help="raw, rollout, grad-rollout, legrad or all; repeat or comma-separate "
                 "(default: rollout)."),
]
LayersOpt = Annotated[
    list[str] | None,
    typer.Option("--layers", "--layer", "-l", help="Attention layers for raw and legrad: indices (-1 = last), "
                 "module names or all (default: raw the last, legrad all)."),
]
HeadsOpt = Annotated[str, typer.Option("--heads", help="raw: head indices like 0,3, all, or a fusion: mean, max, min.")]
QueryOpt = Annotated[str, typer.Option("--query", help="raw: the query token: cls, mean, or a token index.")]
FusionOpt = Annotated[str, typer.Option("--head-fusion", help="rollout: how heads are fused: mean, max, min.")]
DiscardOpt = Annotated[
    float, typer.Option("--discard-ratio", help="rollout: the fraction of lowest attentions dropped per layer.")
]
MosaicOpt = Annotated[bool, typer.Option("--mosaic", help="Also draw every layer by every head (mosaic.png).")]


@shared_options()
def attention(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    method: MethodOpt = None,
    layers: LayersOpt = None,
    heads: HeadsOpt = "mean",
    query: QueryOpt = "cls",
    head_fusion: FusionOpt = "mean",
    discard_ratio: DiscardOpt = 0.0,
    mosaic: MosaicOpt = False,
    target: c.TargetOpt = "predicted",
    colormap: c.ColormapOpt = "jet",
    save_raw: c.SaveRawOpt = False,
    evaluate: EvaluateOpt = False,
    metric: MetricOpt = None,
    boxes: BoxesOpt = None,
    eval_steps: EvalStepsOpt = 32,
    eval_batch: EvalBatchOpt = 64,
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Attention maps of vision transformers, for any attention kernel (fused SDPA, nn.MultiheadAttention,
    eager softmax), with no change to the model.

    Methods: raw attention of chosen layers and heads; rollout (Abnar & Zuidema 2020); grad-rollout
    (Chefer et al. 2021); legrad (Bousselham et al. 2024). Files per image: one overlay per method,
    one head grid per raw layer, with --mosaic every layer by every head.
    Example: inspect-model attention vit_b_16 cat.jpg --method rollout,grad-rollout,legrad --output-dir attn
    """
    from inspect_model.api.attention import attention as api_attention
    from inspect_model.methods.attention import AttentionOptions
    from inspect_model.render.overlay import check_colormap

    run_opts.check(save_raw=save_raw)
    # Checked here, before the model loads: a bad option is one line at once.
    AttentionOptions(methods=tuple(method or ["rollout"]), layers=tuple(layers or ()), heads=heads, query=query,
                     head_fusion=head_fusion, discard_ratio=discard_ratio, mosaic=mosaic)
    check_colormap(colormap)
    from inspect_model.api.cam_evaluate import check_evaluate_request

    check_evaluate_request(evaluate=evaluate, metrics=metric, boxes=boxes, steps=eval_steps, batch=eval_batch)
    run_api("attention", api_attention, opts, inputs, run_opts, methods=list(method or ["rollout"]),
            layers=list(layers or []), heads=heads, query=query, head_fusion=head_fusion,
            discard_ratio=discard_ratio, mosaic=mosaic, target=target, colormap=colormap, save_raw=save_raw,
            evaluate=evaluate, metrics=metric, boxes=boxes, eval_steps=eval_steps, eval_batch=eval_batch)
