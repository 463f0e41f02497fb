"""Guided backprop speed: ours vs the floor, and vs captum's GuidedBackprop (optional).

The floor is one forward pass plus one backward pass to the input with every parameter
frozen (no weight gradients): what any input-gradient method must pay. Issue 6 asks for
ours <= 1.1x the floor and no slower than captum on vgg16 and resnet50 (weights none,
batch 4 to 8, CPU). Measurements are interleaved (floor, ours, captum, floor, ...) so that
load from other processes hits all three alike. Reported: the minimum over repeats of the
wall time and of the process CPU time (all threads; the CPU time is what load from other
processes on a shared machine disturbs least), and the ratios of both.

    python benchmarks/bench_guided_backprop.py [--models vgg16 resnet50] [--batch 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vgg16", "resnet50"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    try:
        from captum.attr import GuidedBackprop
    except ImportError:
        GuidedBackprop = None
        print("captum not installed: skipping the captum comparison (pip install 'inspect-model[bench]')")
    dev = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {dev}, batch {args.batch}, "
          f"{args.size}x{args.size}, best of {args.repeats}")

    for name in args.models:
        bench_model(name, args, dev, GuidedBackprop)


def bench_model(name: str, args: argparse.Namespace, dev: Any, GuidedBackprop: Any) -> None:
    import torch
    import torchvision

    from inspect_model.methods.guided.backprop import guided_backprop

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval().to(dev)
    x = torch.randn(args.batch, 3, args.size, args.size, device=dev)
    targets = [[i * 7 % 1000] for i in range(args.batch)]
    flat_targets = [t[0] for t in targets]

    def floor() -> torch.Tensor:
        for p in model.parameters():
            p.requires_grad_(False)
        try:
            leaf = x.detach().requires_grad_(True)
            out = model(leaf.clone())
            onehot = torch.zeros_like(out)
            onehot[torch.arange(args.batch), flat_targets] = 1.0
            (g,) = torch.autograd.grad(out, leaf, grad_outputs=onehot)
            return g
        finally:
            for p in model.parameters():
                p.requires_grad_(True)

    def ours() -> torch.Tensor:
        return guided_backprop(model, x, targets).gradients[:, 0]

    runs = {"floor": floor, "ours": ours}
    if GuidedBackprop is not None:
        gbp = GuidedBackprop(model)

        def captum_gb() -> torch.Tensor:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return gbp.attribute(x.clone(), target=flat_targets)

        runs["captum"] = captum_gb
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    results: dict[str, torch.Tensor] = {}
    for k, fn in runs.items():  # warm-up
        results[k] = fn().detach().float().cpu()
    for _ in range(args.repeats):
        for k, fn in runs.items():
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    for label, data in (("wall", times), ("cpu ", cpu)):
        best = {k: min(v) for k, v in data.items()}
        line = f"{name:10s} {label} floor {best['floor'] * 1e3:8.1f} ms  ours {best['ours'] * 1e3:8.1f} ms  " \
               f"ours/floor {best['ours'] / best['floor']:.3f}x (target <= 1.1)"
        if "captum" in best:
            line += f"  captum {best['captum'] * 1e3:8.1f} ms  ours/captum {best['ours'] / best['captum']:.3f}x " \
                    "(target <= 1.0)"
        print(line)
    if "captum" in results:
        a, b = results["ours"], results["captum"]
        rel = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        print(f"{'':10s} max |ours - captum| / max |captum| = {rel:.2e}")


TITLE = "guided-backprop"


def measure(ctx):  # type: ignore[no-untyped-def]
    """Guided backprop against one forward + backward to the input (parameters frozen), and
    captum's GuidedBackprop as the peer (issue 6: <= 1.1x the floor, no slower than captum)."""
    import torch

    from common import Row, Target
    from inspect_model.methods.guided.backprop import guided_backprop

    rows = []
    for name in ctx.sizes.models:
        model = ctx.model(name)
        x = ctx.images(ctx.sizes.batch, 224 if name.startswith("vit") else None)
        targets = [[i * 7 % 1000] for i in range(x.shape[0])]
        flat = [t[0] for t in targets]

        def floor() -> None:
            req = [p.requires_grad for p in model.parameters()]
            for p in model.parameters():
                p.requires_grad_(False)
            try:
                leaf = x.detach().requires_grad_(True)
                out = model(leaf.clone())
                onehot = torch.zeros_like(out)
                onehot[torch.arange(x.shape[0]), flat] = 1.0
                torch.autograd.grad(out, leaf, grad_outputs=onehot)
            finally:
                for p, r in zip(model.parameters(), req):
                    p.requires_grad_(r)

        fns = {"floor": floor, "ours": lambda: guided_backprop(model, x, targets)}
        if ctx.peers["captum"] and not name.startswith("vit"):
            from captum.attr import GuidedBackprop

            gbp = GuidedBackprop(model)

            def peer() -> None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    gbp.attribute(x.clone(), target=flat)

            fns["peer"] = peer
        t = ctx.time(fns)
        rows.append(Row("guided-backprop", f"guided-backprop {name} batch {x.shape[0]}", t["ours"], t["floor"],
                        Target("ratio", 1.1, "<= 1.1x floor"), peer=t.get("peer"), peer_name="captum",
                        floor_what="forward + backward to input"))
    return rows


if __name__ == "__main__":
    main()
