"""Benchmark the attention methods against the model's own passes, in one process.

    python benchmarks/bench_attention.py [--model vit_b_16] [--batch 8] [--repeats 3] [--threads N]

(``--model swin_t`` or ``maxvit_t`` times the windowed path: rollout through shifted windows
and patch merging, LeGrad on the last stage.)

Baselines (weights none, eval, parameters frozen as the methods run them):
- forward: ``model(x)`` under ``torch.no_grad()``;
- forward+backward: ``model(x)``, then the gradient of the top class's score with respect to
  the input (what a gradient method needs at least).
Measured: ``raw`` (last layer), ``rollout`` against the forward; ``grad-rollout`` and ``legrad``
(all layers) against the forward+backward. Targets: 1.15x each. Printed as seconds (best of
``--repeats``, runs interleaved) and ratios.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def best(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    times = {k: float("inf") for k in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():  # interleaved, so that a noisy neighbour hits every one
            t0 = time.process_time()
            fn()
            times[k] = min(times[k], time.process_time() - t0)
    return times


def baselines(model: Any, x: Any) -> dict[str, Any]:
    """The passes the methods are measured against (weights none, eval, parameters frozen as
    the methods run them): ``forward`` under no_grad, and ``forward+backward``, the gradient
    of the top class's score with respect to the input."""
    import torch

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def forward_backward() -> None:
        flags = [p.requires_grad for p in model.parameters()]
        for p in model.parameters():
            p.requires_grad_(False)
        try:
            xin = x.clone().requires_grad_(True)
            y = model(xin)
            torch.autograd.grad(y.gather(1, y.argmax(1, keepdim=True)).sum(), xin)
        finally:
            for p, f in zip(model.parameters(), flags, strict=True):
                p.requires_grad_(f)

    return {"forward": forward, "forward+backward": forward_backward}


def main() -> None:
    import torch
    import torchvision

    from inspect_model.methods.attention.maps import AttentionOptions
    from inspect_model.methods.attention.passes import compute_attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model, weights=None).eval()
    head = getattr(getattr(model, "heads", None), "head", None)
    if head is not None:
        torch.nn.init.normal_(head.weight, std=0.02)  # torchvision starts ViT's head at zero
    x = torch.randn(args.batch, 3, args.size, args.size)

    def method(name: str) -> Any:
        opts = AttentionOptions(methods=(name,))
        return lambda: compute_attention(model, x, opts)

    base = baselines(model, x)
    fns = {"forward": base["forward"], "raw": method("raw"), "rollout": method("rollout"),
           "forward+backward": base["forward+backward"], "grad-rollout": method("grad-rollout"),
           "legrad": method("legrad")}
    times = best(fns, args.repeats)
    print(f"{args.model}, weights none, batch {args.batch}, {args.size}x{args.size}, "
          f"{torch.get_num_threads()} thread(s), best of {args.repeats}")
    for name, t in times.items():
        base = "forward" if name in ("forward", "raw", "rollout") else "forward+backward"
        ratio = t / times[base]
        mark = "" if name == base else ("  ok (<= 1.15x)" if ratio <= 1.15 else "  OVER 1.15x")
        print(f"  {name:<18} {t:8.3f} s  {ratio:5.2f}x {base}{mark}")


TITLE = "attention"


def measure(ctx):  # type: ignore[no-untyped-def]
    """vit_b_16 at 224 px (batch 8 in full mode and on an accelerator; 2 quick, 1 smoke):
    raw and rollout against one no-grad forward, grad-rollout and LeGrad against one forward
    + backward to the input (issue 26: each <= 1.15x). Smoke mode, which only checks that it
    runs, builds the ViT for 112 px (49 patches, not 196: the same code, a quarter of the work)."""
    import torch
    import torchvision

    from common import Row, Target
    from inspect_model.methods.attention.maps import AttentionOptions
    from inspect_model.methods.attention.passes import compute_attention

    batch = 8 if ctx.mode == "full" or ctx.device.type != "cpu" else (2 if ctx.mode == "quick" else 1)
    size = 112 if ctx.mode == "smoke" else 224
    if size == 224:
        model = ctx.model("vit_b_16")
    else:
        torch.manual_seed(0)
        model = torchvision.models.vit_b_16(weights=None, image_size=size).eval().to(ctx.device)
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts ViT's head at zero
    x = ctx.images(batch, size)

    def method(name: str) -> Any:
        opts = AttentionOptions(methods=(name,))
        return lambda: compute_attention(model, x, opts)

    names = ("raw", "rollout", "grad-rollout", "legrad")
    t = ctx.time({**baselines(model, x), **{n: method(n) for n in names}})
    rows = []
    for n in names:
        base = "forward" if n in ("raw", "rollout") else "forward+backward"
        target = Target("ratio", 1.15, "<= 1.15x " + base) if n != "raw" else Target("info", 0, "-")
        what = "no-grad forward" if base == "forward" else "forward + backward to the input"
        px = "" if size == 224 else f" ({size} px)"
        rows.append(Row("attention", f"attention {n} vit_b_16 batch {batch}{px}", t[n], t[base], target,
                        floor_what=what))
    return rows


if __name__ == "__main__":
    main()
