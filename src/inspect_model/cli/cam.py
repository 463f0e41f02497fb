"""``inspect-model cam MODEL IMAGE ...``: class activation maps per image, target, method and layer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.shared import RunOptions, run_api, shared_options
from inspect_model.methods.cam_methods import method_help

EXAMPLE = "inspect-model cam resnet50 cat.jpg --method gradcam --method scorecam --target top:2 -o cams"

MethodOpt = Annotated[
    list[str] | None,
    typer.Option("--method", "-m", help=method_help()),
]
LayerOpt = Annotated[
    list[str] | None,
    typer.Option("--layer", "-l", help="auto (last spatial layer; ViT/Swin: last block as a patch grid) "
                 "or a layer spec; repeat for one map per layer."),
]
ReshapeOpt = Annotated[
    str | None, typer.Option("--reshape", help="Patch grid HxW for a token layer (N, tokens, D); "
                                "leading class/register tokens are dropped.")
]
FuseOpt = Annotated[
    bool, typer.Option("--fuse", help="With several --layer: also a fused map (element-wise max of the "
                       "normalised maps).")
]
ScoreBatchOpt = Annotated[
    int, typer.Option("--scorecam-batch", help="Masked inputs per forward pass for scorecam.")
]
AlphaOpt = Annotated[float, typer.Option("--alpha", help="Heat-map opacity in overlays, 0..1.")]
TopOpt = Annotated[int, typer.Option("--top", help="Predicted classes listed per image.")]
EvaluateOpt = Annotated[
    bool, typer.Option("--evaluate", help="Score every map's faithfulness: deletion/insertion AUC, ROAD, "
                       "average drop/increase in confidence, and with --boxes the pointing and energy games; "
                       "methods ranked per image and on average.")
]
MetricOpt = Annotated[
    list[str] | None,
    typer.Option("--metric", help="With --evaluate: deletion, insertion, road, confidence, pointing, energy "
                 "or all (default: all; pointing and energy only with --boxes); repeatable."),
]
BoxesOpt = Annotated[
    Path | None, typer.Option("--boxes", help="JSON or CSV of boxes image,x0,y0,x1,y1[,label] in "
                              "original-image pixels: with --evaluate for the pointing and energy games; for a "
                              "detector the boxes to explain, for a segmenter the region of the mask.")
]
EvalStepsOpt = Annotated[int, typer.Option("--eval-steps", help="Steps of the deletion and insertion curves.")]
EvalBatchOpt = Annotated[int, typer.Option("--eval-batch", help="Perturbed inputs per forward pass (--evaluate).")]


@shared_options()
def cam(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    method: MethodOpt = None,
    layer: LayerOpt = None,
    reshape: ReshapeOpt = None,
    fuse: FuseOpt = False,
    target: c.TargetOpt = "predicted",
    output_key: c.OutputKeyOpt = None,
    scorecam_batch: ScoreBatchOpt = 32,
    colormap: c.ColormapOpt = "jet",
    alpha: AlphaOpt = 0.5,
    top: TopOpt = 5,
    save_raw: c.SaveRawOpt = False,
    evaluate: EvaluateOpt = False,
    metric: MetricOpt = None,
    boxes: BoxesOpt = None,
    eval_steps: EvalStepsOpt = 32,
    eval_batch: EvalBatchOpt = 64,
    score_threshold: c.ScoreThresholdOpt = None,
    max_detections: c.MaxDetectionsOpt = 10,
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Class activation maps: CAM, Grad-CAM, Grad-CAM++, XGrad-CAM, Layer-CAM, HiResCAM,
    Score-CAM and Eigen-CAM.

    All gradient methods come from one forward pass and a backward pass that stops at the
    layer. With --output-dir: per image, target, method and layer a heat-map overlay on the
    original image, the bare map with a colour bar, --save-raw .npy maps, and contact sheets.
    --evaluate scores and ranks the maps (faithfulness) and plots deletion/insertion curves.

    Example: inspect-model cam resnet50 cat.jpg --method gradcam --method scorecam --target top:2 -o cams
    """
    from inspect_model.api.cam import cam as api_cam
    from inspect_model.api.cam import check_cam_request
    from inspect_model.api.cam_evaluate import check_evaluate_request

    run_opts.check(save_raw=save_raw)
    check_cam_request(methods=method or ["gradcam"], layers=layer, reshape=reshape, fuse=fuse,
                              scorecam_batch=scorecam_batch, colormap=colormap, alpha=alpha, top=top)
    check_evaluate_request(evaluate=evaluate, metrics=metric, boxes=boxes, steps=eval_steps, batch=eval_batch)
    run_api("cam", api_cam, opts, inputs, run_opts, methods=method, layers=layer, reshape=reshape,
            fuse=fuse, target=target, output_key=output_key, scorecam_batch=scorecam_batch, colormap=colormap,
            alpha=alpha, top=top, save_raw=save_raw, evaluate=evaluate, metrics=metric, boxes=boxes,
            eval_steps=eval_steps, eval_batch=eval_batch, score_threshold=score_threshold,
            max_detections=max_detections)
