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

    from inspect_model.methods.cam import compute_cams

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


if __name__ == "__main__":
    main()
