"""Benchmark ``patch`` (issue 36): a (layers x positions) residual-stream grid against the
forward passes it cannot avoid, in one process.

    python benchmarks/bench_patch.py [--tokens 32] [--batch 32] [--repeats 3] [--threads 1]

A GPT-2 of 6 layers, width 256, 4 heads, random weights. Ours: methods/lm/grid.run_pair
over the residual grid (the clean and corrupted runs with their activations captured, then
one patched run per cell, ``--batch`` cells per forward, the metric of every row). Floor:
the same forward passes without hooks (the two one-row runs, then ceil(cells / batch)
forwards of the same row counts) under ``torch.no_grad()``. Target: <= 1.2x. On this
shared 2-core machine run it with ``--clock cpu --threads 1`` (run.py): CPU time of the
process, best of the repeats, runs interleaved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

TITLE = "patch"


def build(tokens: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=256, n_layer=6, n_head=4, n_positions=max(tokens, 64))
    return transformers.GPT2LMHeadModel(cfg).eval()


def contestants(model: Any, tokens: int, batch: int) -> dict[str, Any]:
    import torch

    from inspect_model.methods.lm.anatomy import find_anatomy
    from inspect_model.methods.lm.grid import run_pair
    from inspect_model.methods.lm.metrics import Metric, MetricSpec
    from inspect_model.methods.lm.patching import modules_of

    g = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    clean = torch.randint(5, 1000, (tokens,), generator=g).to(device)
    corrupt = clean.clone()
    corrupt[tokens // 3] = (corrupt[tokens // 3] + 1) % 1000
    mods = modules_of(model, find_anatomy(model))
    metric = Metric(MetricSpec("logit-diff", ("a", "b")), (1, 2), ("a", "b"))
    cells = mods.layers * tokens
    rows = [min(batch, cells - s) for s in range(0, cells, batch)]

    def call(ids: Any) -> Any:
        return model(input_ids=ids, use_cache=False).logits

    def ours() -> None:
        run_pair(model, mods, call, metric, clean=clean, corrupt=corrupt, sites=("resid",), per_forward=batch)

    def floor() -> None:
        with torch.no_grad():
            call(clean[None])
            call(corrupt[None])
            for n in rows:
                call(corrupt[None].expand(n, -1))

    return {"forwards": floor, "patch": ours, "_cells": cells, "_forwards": len(rows)}  # type: ignore[dict-item]


def measure(ctx):  # type: ignore[no-untyped-def]
    """The residual grid of 6 layers x T tokens (T 32 full, 16 quick, 8 smoke), 32 cells per
    forward, against its unavoidable forwards (issue 36: <= 1.2x)."""
    from common import Row, Target

    tokens = 32 if ctx.mode == "full" or ctx.device.type != "cpu" else (16 if ctx.mode == "quick" else 8)
    model = build(tokens).to(ctx.device)
    c = contestants(model, tokens, 32)
    cells, forwards = c.pop("_cells"), c.pop("_forwards")
    t = ctx.time(c)
    return [Row("patch", f"patch resid grid gpt2-6L 6x{tokens} cells, 32 per forward", t["patch"], t["forwards"],
                Target("ratio", 1.2, "<= 1.2x forwards"),
                floor_what=f"2 one-row + {forwards} batched no-grad forwards, no hooks ({cells} cells)")]


def main() -> None:
    import time

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    c = contestants(build(args.tokens), args.tokens, args.batch)
    cells, forwards = c.pop("_cells"), c.pop("_forwards")
    best: dict[str, float] = {}
    for fn in c.values():
        fn()
    for _ in range(args.repeats):
        for name, fn in c.items():
            t0 = time.process_time()
            fn()
            best[name] = min(best.get(name, 1e9), time.process_time() - t0)
    print(f"{cells} cells in {forwards} batched forwards: patch {best['patch']:.3f} s CPU, forwards "
          f"{best['forwards']:.3f} s CPU, ratio {best['patch'] / best['forwards']:.3f} (target <= 1.2)")


if __name__ == "__main__":
    main()
