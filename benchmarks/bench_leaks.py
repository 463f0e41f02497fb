"""Memory and leaks (issue 9): run ``cam`` and ``grads`` many times in one process through
the Python API (``methods.cam.compute_cams`` with every gradient method, and
``methods.gradients.gradients`` with histograms) and show that memory does not grow.

Printed per workload: RSS after the first 10 runs (the baseline: allocator pools and lazy
imports settle there), RSS at the end, the growth in total and per run after the baseline,
and what the garbage collector still sees afterwards: live autograd graphs (tensors with a
``grad_fn``), tensors that require grad, hooks left on the model, and HookEngine objects.
The model is checked untouched (hooks, flags, ``.grad``) after every workload.

    python benchmarks/bench_leaks.py [--runs 200] [--model resnet18|tiny] [--size 64] [--batch 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import time


def rss_mb() -> float:
    """Resident set size now (Linux /proc; psutil or resource elsewhere)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        try:
            import psutil

            return psutil.Process().memory_info().rss / 2**20
        except ImportError:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak, not current


def lingering(model) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """What gc still holds after the runs: autograd graphs, grad-requiring tensors, hooks."""
    import warnings

    import torch

    from inspect_model.engine.hooks import HookEngine

    gc.collect()
    graphs = grad_tensors = engines = 0
    warnings.filterwarnings("ignore", category=FutureWarning)  # isinstance on deprecated torch aliases
    params = {id(p) for p in model.parameters()}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                if obj.grad_fn is not None:
                    graphs += 1
                if obj.requires_grad and id(obj) not in params:
                    grad_tensors += 1
            elif isinstance(obj, HookEngine):
                engines += 1
        except ReferenceError:  # weak proxies
            continue
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())
    return {"graphs": graphs, "grad_tensors": grad_tensors, "hooks": hooks, "engines": engines}


def build(name: str):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    if name == "tiny":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(32, 10)).eval()
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval()


def rss_growth(label: str, fn, runs: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    gc.collect()
    start = rss_mb()
    base = None
    t0 = time.perf_counter()
    for i in range(runs):
        fn()
        if i == 9:
            gc.collect()
            base = rss_mb()
    gc.collect()
    end = rss_mb()
    base = base if base is not None else start
    after = max(runs - 10, 1)
    row = {"start": start, "base": base, "end": end, "total": end - base, "per_run_kb": (end - base) * 1024 / after,
           "seconds": time.perf_counter() - t0}
    print(f"{label:<26} rss first10 {base:8.1f} MiB  end {end:8.1f} MiB  growth after first 10: "
          f"{row['total']:+7.2f} MiB total, {row['per_run_kb']:+7.2f} KiB/run  ({runs} runs, {row['seconds']:.1f} s)")
    return row


def main() -> None:
    import torch

    from inspect_model.methods.cam.maps import compute_cams
    from inspect_model.methods.gradients.flow import gradients

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--model", default="resnet18", help="a torchvision model name, or 'tiny'")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))

    model = build(args.model)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    hooks_before = lingering(model)["hooks"]
    print(f"model {args.model}, input {tuple(x.shape)}, torch {torch.__version__}; API: "
          "methods.cam.compute_cams, methods.gradients.gradients")

    def cam_once() -> None:
        res = compute_cams(model, x, methods=["gradients"], target="top:2")
        assert len(res.maps) == 5 * 2 * args.batch

    def grads_once() -> None:
        rep = gradients(model, x, histograms=True, clip_norm=1.0)
        assert rep.layers

    results = {}
    for label, fn in (("cam (5 gradient methods)", cam_once), ("grads (with histograms)", grads_once)):
        results[label] = rss_growth(label, fn, args.runs)
        left = lingering(model)
        print(f"{'':<26} after: {left['graphs']} tensors with a grad_fn, {left['grad_tensors']} non-parameter "
              f"tensors requiring grad, {left['hooks'] - hooks_before} hooks left, {left['engines']} HookEngines alive")
        assert left["hooks"] == hooks_before, "hooks left on the model"
        assert all(p.grad is None for p in model.parameters()), ".grad fields left on the model"
        assert not any(m.training for m in model.modules()), "training flags changed"
    worst = max(r["per_run_kb"] for r in results.values())
    print(f"worst growth per run after the first 10: {worst:+.2f} KiB "
          f"({'within noise' if worst < 64 else 'GROWS: look for a leak'}; noise here is about +-64 KiB/run)")


TITLE = "leaks"


def measure(ctx):  # type: ignore[no-untyped-def]
    """Memory after many `cam` runs in one process against memory after the first 10
    (flat: <= 1.05x). RSS on a CPU, allocated bytes on CUDA. Smoke mode, which checks that it
    runs, compares run 2 with run 1."""
    import torch

    from common import Row, Target
    from inspect_model.methods.cam.maps import compute_cams

    runs = {"full": 200, "quick": 30, "smoke": 2}[ctx.mode]
    warm = 1 if ctx.mode == "smoke" else 10
    model = ctx.model(ctx.sizes.cnn)
    x = ctx.images(2, 64)

    def used() -> float:
        gc.collect()
        return torch.cuda.memory_allocated() / 2**20 if ctx.device.type == "cuda" else rss_mb()

    base = 0.0
    for i in range(runs):
        compute_cams(model, x, methods=["gradients"], target="top:2")
        if i == warm - 1:
            base = used()
    end = used()
    what = f"after {warm} run" + "s" * (warm > 1)
    return [Row("memory", f"cam (5 gradient methods) x {runs} runs: memory after the last / after run {warm}",
                end, base, Target("ratio", 1.05, "<= 1.05x (flat)"), unit="MiB", floor_what=what)]


if __name__ == "__main__":
    main()
