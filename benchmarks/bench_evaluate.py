"""Benchmark `cam --evaluate`: its cost relative to the CAM itself (per metric), and ROAD
against pytorch-grad-cam's ROAD where the two definitions coincide.

    python benchmarks/bench_evaluate.py [--model resnet18] [--images 2] [--size 224] [--device cpu]

1. Cost: the same images and model, `cam` with Grad-CAM alone, then with `--evaluate` for
   each metric and for all of them; printed as seconds and as a multiple of the CAM run.
2. ROAD vs pytorch-grad-cam (optional: `pip install grad-cam`, the `bench` extra; skipped
   with a message without it). The definitions coincide when (a) both impute the same
   removed pixels: pytorch-grad-cam removes the pixels at or above the map's
   ``percentile``-th percentile, so its percentile p is our fraction 1 - p/100, and ties and
   its percentile interpolation move at most a pixel or two, so the map gets a 1e-6 jitter
   to break ties; (b) both score the softmax probability (its
   ``ClassifierOutputSoftmaxTarget``) without the difference to the unperturbed score
   (``return_diff=False``); (c) the noise is off in both (its noise cannot share our random
   stream; with noise on, the scores are compared with a tolerance instead).
   Printed: the largest difference of the imputed images given identical masks, of the
   probabilities per fraction, of ROADCombined, and both imputations' time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def timed(fn: Any, repeats: int, warm: bool = True) -> tuple[float, Any]:
    """Best of ``repeats`` runs (after a warm-up run unless ``warm`` is False), and a result."""
    out = fn() if warm else None
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def cost(model: Any, x: Any, args: argparse.Namespace) -> None:
    from inspect_model.api.cam import cam

    def run(metrics: list[str] | None) -> Any:
        return cam(model, x, methods=["gradcam"], layers=[args.layer], evaluate=metrics is not None,
                   metrics=metrics, eval_steps=args.steps, eval_batch=args.eval_batch)

    base, _ = timed(lambda: run(None), args.repeats)
    print(f"\n1. cost of --evaluate ({x.shape[0]} image(s), Grad-CAM at {args.layer}, {args.steps} steps, "
          f"--eval-batch {args.eval_batch}); best of {args.repeats}")
    print(f"  {'cam (Grad-CAM only)':<34} {base:8.3f} s   1.0x")
    for metrics in (["deletion"], ["insertion"], ["road"], ["confidence"], ["all"]):
        # The CAM run above warmed everything up; one timed run each (ROAD is the slow one).
        t, res = timed(lambda m=metrics: run(m), 1, warm=False)
        r = res.to_dict()["evaluation"]
        print(f"  {'+ --evaluate --metric ' + metrics[0]:<34} {t:8.3f} s {t / base:6.1f}x   "
              f"({r['inputs']} perturbed inputs, {r['passes']} passes)")


def road_vs_grad_cam(model: Any, x: Any, args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from inspect_model.methods.faithfulness import metrics as fa
    from inspect_model.methods.cam.maps import gradcam
    from inspect_model.methods.faithfulness.passes import MapJob, evaluate_maps

    print("\n2. ROAD vs pytorch-grad-cam")
    try:
        from pytorch_grad_cam.metrics.road import (
            NoisyLinearImputer,
            ROADLeastRelevantFirst,
            ROADMostRelevantFirst,
        )
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget
    except ImportError as exc:
        print(f"  skipped: pytorch-grad-cam is not installed ({exc}); pip install grad-cam (the bench extra)")
        return
    x = x[:1]
    with torch.no_grad():
        cls = int(model(x).argmax(1)[0])
    sal = gradcam(model, x, args.layer, [cls])[0, 0].cpu()
    sal = sal + 1e-6 * torch.rand(sal.shape, generator=torch.Generator().manual_seed(0))  # no ties
    hw = tuple(sal.shape)
    n = hw[0] * hw[1]
    cam_np = sal.numpy()[None]

    # (a) the imputation alone, identical masks, no noise
    order = fa.pixel_order(sal)
    masks = torch.cat([fa.road_masks(order, hw, fa.ROAD_FRACTIONS, True),
                       fa.road_masks(order, hw, fa.ROAD_FRACTIONS, False)])
    xi = x[0].cpu().float()
    t0 = time.perf_counter()
    ours = fa.impute(xi.to(args.device), masks.to(args.device)).cpu()
    t_ours = time.perf_counter() - t0
    imp = NoisyLinearImputer(noise=0.0)
    t0 = time.perf_counter()
    theirs = torch.stack([imp(xi, (~m).float()) for m in masks])
    t_theirs = time.perf_counter() - t0
    rng = float(xi.max() - xi.min())
    print(f"  imputation, {len(masks)} masks of {hw[0]}x{hw[1]}: largest difference {float((ours - theirs).abs().max()):.2e} "
          f"(input range {rng:.2f}); ours {t_ours:.2f} s ({args.device}, conjugate gradients), "
          f"pytorch-grad-cam {t_theirs:.2f} s (scipy spsolve, CPU): {t_theirs / t_ours:.1f}x")

    # (b) the scores, pixel sets chosen by each implementation's own rule
    target = [ClassifierOutputSoftmaxTarget(cls)]

    def grad_cam_curve(cls_: Any, noise: float) -> list[float]:
        out = []
        for f in fa.ROAD_FRACTIONS:
            metric = cls_(percentile=round(100 * (1 - f)))
            metric.perturbation.imputer.noise = noise
            with torch.no_grad():
                out.append(float(metric(x, cam_np, target, model, return_diff=False)[0]))
        return out

    for noise in (0.0, fa.ROAD_NOISE):
        saved = fa.ROAD_NOISE
        fa.ROAD_NOISE = noise
        try:
            [res], _ = evaluate_maps(model, x, [MapJob(0, cls, sal)], metrics=["road"], batch=args.eval_batch)
        finally:
            fa.ROAD_NOISE = saved
        morf = grad_cam_curve(ROADMostRelevantFirst, noise)
        lerf = grad_cam_curve(ROADLeastRelevantFirst, noise)
        d_morf = np.abs(np.array(res.curves["road_morf"]) - morf).max()
        d_lerf = np.abs(np.array(res.curves["road_lerf"]) - lerf).max()
        combined = (np.mean(lerf) - np.mean(morf)) / 2  # ROADCombined: mean(LeRF - MoRF) / 2
        print(f"  noise {noise:<5}: largest probability difference MoRF {d_morf:.2e}, LeRF {d_lerf:.2e}; "
              f"ROAD combined ours {res.scores['road']:.5f} vs pytorch-grad-cam {combined:.5f} "
              f"(difference {abs(res.scores['road'] - combined):.2e})")
    print(f"  (removed-pixel counts: ours round(f * {n}); pytorch-grad-cam: pixels >= np.percentile(map, p))")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--layer", default="layer4")
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--skip-cost", action="store_true")
    args = ap.parse_args()

    import torch
    from torchvision import models

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = models.get_model(args.model, weights=None).eval().to(args.device)
    x = torch.randn(args.images, 3, args.size, args.size, device=args.device)
    print(f"{args.model}, weights none, {args.images} image(s) {args.size}x{args.size}, {args.device}, "
          f"{torch.get_num_threads()} threads")
    if not args.skip_cost:
        cost(model, x, args)
    road_vs_grad_cam(model, x, args)


TITLE = "faithfulness"


def measure(ctx):  # type: ignore[no-untyped-def]
    """ROAD's imputation of 18 masks (MoRF + LeRF, 10..90 %) of one image against
    pytorch-grad-cam's NoisyLinearImputer on the same masks (issue 30: >= 3x faster, images
    within 1e-3; floor: the forward pass of the 18 imputed images), and `cam --evaluate`
    with every metric against the Grad-CAM run it judges (information: issue 30 asked for 10x,
    the forward passes it reads are alone several times that) and against those passes (issue
    40: <= 1.2x)."""
    import torch

    from common import Row, Target
    from inspect_model.api.cam import cam
    from inspect_model.methods.faithfulness import metrics as fa
    from inspect_model.methods.cam.maps import gradcam

    size = 224 if ctx.mode == "full" or ctx.device.type != "cpu" else (112 if ctx.mode == "quick" else 64)
    model = ctx.model(ctx.sizes.cnn)
    x = ctx.images(1, size)
    with torch.no_grad():
        cls = int(model(x).argmax(1)[0])
    sal = gradcam(model, x, "layer4", [cls])[0, 0].cpu()
    sal = sal + 1e-6 * torch.rand(sal.shape, generator=torch.Generator().manual_seed(0))  # no ties
    order = fa.pixel_order(sal)
    masks = torch.cat([fa.road_masks(order, (size, size), fa.ROAD_FRACTIONS, first) for first in (True, False)])
    xi = x[0]
    out: dict[str, torch.Tensor] = {}

    def ours() -> None:
        out["ours"] = fa.impute(xi, masks.to(ctx.device))

    def floor() -> None:
        with torch.no_grad():
            model(out["ours"])

    fns = {"ours": ours, "floor": floor}
    if ctx.peers["pytorch-grad-cam"]:
        from pytorch_grad_cam.metrics.road import NoisyLinearImputer

        imp = NoisyLinearImputer(noise=0.0)
        xc = xi.cpu().float()

        def peer() -> None:
            out["peer"] = torch.stack([imp(xc, (~m).float()) for m in masks])

        fns["peer"] = peer
    t = ctx.time(fns, repeats=1 if ctx.mode == "full" else None)
    note = f"{len(masks)} masks"
    if "peer" in out:
        note += f"; largest difference to the peer {float((out['ours'].cpu() - out['peer']).abs().max()):.1e}"
    rows = [Row("faithfulness", f"ROAD imputation, 18 masks of {size}x{size}", t["ours"], t["floor"],
                Target("speedup", 3.0, ">= 3x pytorch-grad-cam"), peer=t.get("peer"), peer_name="pytorch-grad-cam",
                floor_what="forward of the 18 imputed images", note=note)]
    xs = ctx.images(2, size)
    steps = 32 if ctx.mode != "smoke" else 8

    def run(metrics):  # type: ignore[no-untyped-def]
        return lambda: cam(model, xs, methods=["gradcam"], layers=["layer4"], evaluate=metrics is not None,
                           metrics=metrics, eval_steps=steps)

    from inspect_model.methods.faithfulness.passes import count_inputs, pass_rows

    # What the scores cannot avoid: one forward pass of every perturbed input they read, as
    # many a pass as evaluate_maps runs, on top of the maps judged.
    n_inputs = count_inputs([0, 1], ["deletion", "insertion", "road", "confidence"], steps, original_known=True)
    per = pass_rows(xs, None)
    noise = torch.randn(min(n_inputs, per), 3, size, size, generator=torch.Generator().manual_seed(1)).to(ctx.device)

    def unavoidable() -> None:
        run(None)()
        with torch.no_grad():
            for start in range(0, n_inputs, per):
                model(noise[: min(per, n_inputs - start)])

    t = ctx.time({"floor": run(None), "ours": run(["all"]), "passes": unavoidable},
                 repeats=1 if ctx.mode == "full" else None)
    work = f"cam --evaluate (all metrics, {steps} steps), {ctx.sizes.cnn} 2 images {size} px"
    # Issue 30 asked for 10x the maps; the forward passes the scores read are alone several
    # times that (the note), so issue 40 set the target on them: the next row.
    rows.append(Row("faithfulness", work, t["ours"], t["floor"], Target("info", 0.0, "information (the passes: next row)"),
                    floor_what="cam gradcam (the maps judged)",
                    note=f"its unavoidable passes alone are {t['passes'] / t['floor']:.0f}x the maps"))
    rows.append(Row("faithfulness", work + ": against its forward passes", t["ours"], t["passes"],
                    Target("ratio", 1.2, "<= 1.2x its passes"),
                    floor_what=f"the maps + {n_inputs} plain forward inputs ({n_inputs // 2} a map, {per} a pass)"))
    if ctx.mode != "smoke":
        rows.append(_auto_row(ctx, model, xs, size, per))
    return rows


def _auto_row(ctx, model, xs, size, per):  # type: ignore[no-untyped-def]
    """Issue 40: ``--eval-steps auto`` (curves refined 8, 16, ... while their AUC moves by more
    than 0.005) against the forward passes it ran: the maps + as many plain forward inputs as
    its report counts, in passes of the same size."""
    import torch

    from common import Row, Target
    from inspect_model.api.cam import cam

    def auto():  # type: ignore[no-untyped-def]
        return cam(model, xs, methods=["gradcam"], layers=["layer4"], evaluate=True, metrics=["all"],
                   eval_steps="auto")

    ev = auto().to_dict()["evaluation"]
    n_inputs = int(ev["inputs"])
    noise = torch.randn(min(n_inputs, per), 3, size, size, generator=torch.Generator().manual_seed(1)).to(ctx.device)

    def unavoidable() -> None:
        cam(model, xs, methods=["gradcam"], layers=["layer4"])
        with torch.no_grad():
            for start in range(0, n_inputs, per):
                model(noise[: min(per, n_inputs - start)])

    t = ctx.time({"ours": auto, "passes": unavoidable}, repeats=1 if ctx.mode == "full" else None)
    steps = sorted({n for e in auto().to_dict()["images"] for m in e["maps"]
                    for n in m["evaluation"].get("steps", {}).values()})
    return Row("faithfulness", f"cam --evaluate --eval-steps auto (all metrics), {ctx.sizes.cnn} 2 images {size} px",
               t["ours"], t["passes"], Target("ratio", 1.2, "<= 1.2x its passes"),
               floor_what=f"the maps + {n_inputs} plain forward inputs ({per} a pass)",
               note=f"curve steps used {steps}, tolerance {ev.get('tolerance')}")


if __name__ == "__main__":
    main()
