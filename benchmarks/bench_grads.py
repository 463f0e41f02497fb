"""`grads` overhead: ours (every leaf hooked, gradient wrt output and input per layer,
statistics and histograms in the hooks, parameter statistics) vs the floor, one forward
plus one backward pass with weight gradients: what any gradient report must pay.
Measurements are interleaved (floor, ours, floor, ...) so that load from other processes
hits both alike; the median of each is reported, with the ratio ours / floor.

    python benchmarks/bench_grads.py [--models resnet18 resnet50] [--batch 4] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch
    import torchvision

    from inspect_model.methods.gradients.flow import gradients

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {dev}, batch {args.batch}, "
          f"{args.size}x{args.size}, median of {args.repeats}")

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for name in args.models:
        model = getattr(torchvision.models, name)(weights=None).to(dev).eval()
        x = torch.rand(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0)).to(dev)

        def floor() -> None:
            xx = x.clone().requires_grad_(True)
            y = model(xx)
            seed = torch.zeros_like(y)
            seed[torch.arange(y.shape[0]), y.argmax(1)] = 1.0
            y.backward(seed)
            model.zero_grad(set_to_none=True)

        def ours() -> None:
            gradients(model, x)

        floor(), ours()  # warm up
        times: dict[str, list[float]] = {"floor": [], "ours": []}
        for _ in range(args.repeats):
            for label, fn in (("floor", floor), ("ours", ours)):
                sync()
                t = time.perf_counter()
                fn()
                sync()
                times[label].append(time.perf_counter() - t)
        f, o = statistics.median(times["floor"]), statistics.median(times["ours"])
        print(f"{name:12s} floor {f * 1000:8.1f} ms   ours {o * 1000:8.1f} ms   ratio {o / f:5.2f}x")


TITLE = "grads"


def measure(ctx):  # type: ignore[no-untyped-def]
    """`grads` (every leaf hooked, statistics, parameter statistics) against one forward and
    one backward with weight gradients, per model."""
    import torch

    from common import Row, Target
    from inspect_model.methods.gradients.flow import gradients

    rows = []
    for name in ctx.sizes.models:
        model = ctx.model(name)
        x = ctx.images(ctx.sizes.batch, 224 if name.startswith("vit") else None)

        def floor() -> None:
            y = model(x.clone().requires_grad_(True))
            seed = torch.zeros_like(y)
            seed[torch.arange(y.shape[0]), y.argmax(1)] = 1.0
            y.backward(seed)
            model.zero_grad(set_to_none=True)

        t = ctx.time({"floor": floor, "ours": lambda: gradients(model, x)})
        rows.append(Row("grads", f"grads {name} batch {x.shape[0]}", t["ours"], t["floor"],
                        Target("ratio", 1.3, "<= 1.3x forward+backward"), floor_what="forward + backward"))
    return rows


if __name__ == "__main__":
    main()
