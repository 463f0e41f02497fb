"""Wrapped models (issue 42): ``activations`` on ``torch.compile(resnet18)`` and on
``DataParallel(resnet18)`` against the plain model, in this process, on the same input.

Before the fix a compiled CNN's first run took 122 s and printed 40 graph-break warnings:
Dynamo traced the model with our hooks in it. The wrappers are now taken off where a model is
loaded (loading/wrappers.py), so the ratio should be about 1 and nothing compiled. Printed:
the best time of each over the repeats (the first run of each counted apart, as a compiled
model's first run is the one that compiles), the ratio to the plain model, Dynamo frames
compiled and warnings raised during the runs.

    python benchmarks/bench_wrapped.py [--model resnet18] [--batch 4] [--size 224] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
import warnings


def main() -> None:
    import torch
    import torchvision
    from torch._dynamo.utils import counters

    import inspect_model as im

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    plain = getattr(torchvision.models, args.model)(weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    models = {"plain": plain, "torch.compile": torch.compile(plain), "DataParallel": torch.nn.DataParallel(plain)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.model}, batch {args.batch}, "
          f"{args.size}x{args.size}, best of {args.repeats} after the first run")
    first: dict[str, float] = {}
    best: dict[str, float] = {}
    frames = sum(counters["frames"].values())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for r in range(args.repeats + 1):
            names = list(models)
            names = names[r % len(names):] + names[:r % len(names)]  # each goes first in turn
            for name in names:  # interleaved: load from other processes hits all alike
                model = models[name]
                t0 = time.perf_counter()
                im.activations(model, x)
                dt = time.perf_counter() - t0
                if r == 0:
                    first[name] = dt
                else:
                    best[name] = min(best.get(name, dt), dt)
    compiled = sum(counters["frames"].values()) - frames
    base = best["plain"]
    for name in models:
        print(f"{name:14s} first {first[name]:7.3f} s   best {best[name]:7.3f} s   ratio {best[name] / base:5.2f}x")
    print(f"Dynamo frames compiled: {compiled}; warnings raised: {len(caught)}")


if __name__ == "__main__":
    main()
