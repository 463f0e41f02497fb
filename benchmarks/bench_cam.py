"""Benchmark `cam`: our Grad-CAM vs pytorch-grad-cam's GradCAM vs the floor of one forward pass,
and `--method all` (CAM + five gradient methods, one pass) vs Grad-CAM alone. Same process, same model, same input.

    python benchmarks/bench_cam.py [--model resnet50] [--batch 8] [--size 224] [--repeats 5]

Targets (issue 7): >= 2.5x pytorch-grad-cam's throughput; `--method all` within 1.2x of
Grad-CAM alone. pytorch-grad-cam is optional (`pip install grad-cam`, the `bench` extra);
without it that comparison is skipped with a message.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def timed_all(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds per function, the runs interleaved (floor, ours, peer,
    floor, ...) so that load from other processes hits every contestant alike."""
    for fn in fns.values():
        fn()  # warm-up (allocator, lazy init)
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--layer", default="layer4")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    args = ap.parse_args()

    import torch
    from torchvision import models

    from inspect_model.methods.cam.maps import compute_cams

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = models.get_model(args.model, weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    print(f"{args.model}, weights none, batch {args.batch}, {args.size}x{args.size}, CPU, "
          f"{torch.get_num_threads()} threads, best of {args.repeats} interleaved runs")

    def floor() -> object:
        with torch.no_grad():
            return model(x)

    def ours(methods: list[str]) -> Callable[[], object]:
        return lambda: compute_cams(model, x, layers=[args.layer], methods=methods)

    fns: dict[str, Callable[[], object]] = {
        "one forward pass (floor)": floor,
        "inspect-model gradcam": ours(["gradcam"]),
        "inspect-model --method all (6 methods)": ours(["all"]),
    }
    peer = None
    try:
        from pytorch_grad_cam import GradCAM
    except ImportError:
        print("pytorch-grad-cam not installed (pip install grad-cam): peer comparison skipped")
    else:
        layer = dict(model.named_modules())[args.layer]
        peer = GradCAM(model=model, target_layers=[layer])
        fns["pytorch-grad-cam GradCAM"] = lambda: peer(input_tensor=x, targets=None)
    times = timed_all(fns, args.repeats)
    if peer is not None:
        peer.activations_and_grads.release()  # its hooks stay on the model otherwise
    rows = list(times.items())
    t_floor, t_ours = times["one forward pass (floor)"], times["inspect-model gradcam"]
    t_all, t_peer = times["inspect-model --method all (6 methods)"], times.get("pytorch-grad-cam GradCAM")
    for name, t in rows:
        print(f"  {name:<42} {t:8.3f} s   {args.batch / t:7.2f} img/s")
    print(f"gradcam / floor:            {t_ours / t_floor:5.2f}x the time of one forward pass")
    ratio_all = t_all / t_ours
    print(f"all / gradcam:              {ratio_all:5.2f}x   (target <= 1.2x: {'PASS' if ratio_all <= 1.2 else 'FAIL'})")
    if t_peer is not None:
        speedup = t_peer / t_ours
        print(f"throughput vs pytorch-grad-cam: {speedup:5.2f}x   (target >= 2.5x: {'PASS' if speedup >= 2.5 else 'FAIL'})")


TITLE = "cam"


def measure(ctx):  # type: ignore[no-untyped-def]
    """Grad-CAM against one forward (peer: pytorch-grad-cam's GradCAM; issue 7: >= 2.5x its
    throughput), `--method all` against Grad-CAM alone (<= 1.2x), and Score-CAM against
    pytorch-grad-cam's ScoreCAM at the same settings (issue 30: >= 1.3x faster)."""
    import torch

    from common import Row, Target
    from inspect_model.methods.cam.maps import compute_cams

    rows = []
    for name in ctx.sizes.models:
        vit = name.startswith("vit")
        model = ctx.model(name)
        x = ctx.images(ctx.sizes.batch, 224 if vit else None)
        layer = "encoder.layers.encoder_layer_11.ln_1" if vit else "layer4"

        def floor(model=model, x=x) -> None:  # type: ignore[no-untyped-def]
            with torch.no_grad():
                model(x)

        def ours(methods, model=model, x=x, layer=layer):  # type: ignore[no-untyped-def]
            return lambda: compute_cams(model, x, layers=[layer], methods=methods)

        fns = {"floor": floor, "ours": ours(["gradcam"]), "all": ours(["all"])}
        peer = None
        if ctx.peers["pytorch-grad-cam"] and not vit:
            from pytorch_grad_cam import GradCAM

            peer = GradCAM(model=model, target_layers=[dict(model.named_modules())[layer]])
            fns["peer"] = lambda peer=peer, x=x: peer(input_tensor=x, targets=None)
        try:
            t = ctx.time(fns)
        finally:
            if peer is not None:
                peer.activations_and_grads.release()  # its hooks stay on the model otherwise
        rows.append(Row("cam", f"cam gradcam {name} batch {x.shape[0]}", t["ours"], t["floor"],
                        Target("speedup", 2.5, ">= 2.5x pytorch-grad-cam"), peer=t.get("peer"),
                        peer_name="pytorch-grad-cam", floor_what="no-grad forward"))
        rows.append(Row("cam", f"cam --method all (6 methods) {name}", t["all"], t["ours"],
                        Target("ratio", 1.2, "<= 1.2x Grad-CAM alone"), floor_what="Grad-CAM alone"))
    rows.append(scorecam_row(ctx))
    return rows


def scorecam_row(ctx):  # type: ignore[no-untyped-def]
    """Score-CAM on ctx.sizes.scorecam. Floor: plain no-grad forwards of as many inputs as
    there are masked inputs (one batch of 64 timed, scaled). The peer runs its own default
    (16 masked inputs per pass, one image at a time), its progress bar silenced."""
    import contextlib
    import io

    import torch

    from common import Row, Target
    from inspect_model.methods.cam.maps import compute_cams

    name, batch, size = ctx.sizes.scorecam
    model = ctx.model(name)
    x = ctx.images(batch, size)
    channels = model.fc.in_features  # a torchvision ResNet: layer4's channels
    rows_in = batch * channels
    probe = ctx.images(64, size, seed=1)

    def floor_batch() -> None:
        with torch.no_grad():
            model(probe)

    ours_maps: dict[str, object] = {}

    def ours() -> None:
        ours_maps["r"] = compute_cams(model, x, layers=["layer4"], methods=["scorecam"])

    fns = {"floor": floor_batch, "ours": ours}
    peer_maps: dict[str, object] = {}
    if ctx.peers["pytorch-grad-cam"]:
        from pytorch_grad_cam import ScoreCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        def peer() -> None:
            with torch.no_grad():
                cls = model(x).argmax(1).tolist()
            cam = ScoreCAM(model=model, target_layers=[model.layer4])
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    peer_maps["r"] = cam(input_tensor=x, targets=[ClassifierOutputTarget(c) for c in cls])
            finally:
                cam.activations_and_grads.release()

        fns["peer"] = peer
    # Each run is minutes on a CPU: no warm-up beyond one batch of the floor, one run each.
    floor_batch()
    t = ctx.time(fns, repeats=1, warm=False)
    floor_s = t["floor"] * rows_in / 64
    note = f"{rows_in} masked inputs"
    if "r" in peer_maps:
        ours_m = torch.stack([m.map for m in sorted(ours_maps["r"].maps, key=lambda m: m.sample)]).reshape(batch, -1).cpu().float()  # type: ignore[attr-defined]
        theirs = torch.as_tensor(peer_maps["r"]).reshape(batch, -1).float()
        corr = torch.stack([torch.corrcoef(torch.stack([a, b]))[0, 1] for a, b in zip(ours_m, theirs)])
        note += f"; map correlation with the peer's {float(corr.min()):.3f}-{float(corr.max()):.3f}"
    return Row("cam", f"Score-CAM {name} batch {batch} ({size} px, layer4)", t["ours"], floor_s,
               Target("speedup", 1.3, ">= 1.3x pytorch-grad-cam"), peer=t.get("peer"), peer_name="pytorch-grad-cam",
               floor_what="no-grad forwards of the masked inputs", note=note)


if __name__ == "__main__":
    main()
