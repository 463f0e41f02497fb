"""``compare`` (issue 38): two resident models of A's architecture, every leaf layer's pair
compared as A produces it (B runs ahead within its byte budget, keeping copies of its layer
outputs; methods/compare/exchange.py), against the floor: one no-grad forward pass of A. The
target is 2.3x: the two forwards (2x) and the per-layer statistics. With ``--clock cpu`` the
process's CPU time counts every thread.
A second row times the whole API call (``im.compare(a, x, against_model=b)``: B copied,
layers matched, report built) for information.

    python benchmarks/bench_compare.py [--model resnet18] [--batch 2] [--size 112] [--repeats 3]
"""

from __future__ import annotations

from typing import Any

TITLE = "compare"


def measure(ctx: Any) -> list[Any]:
    import torch

    import inspect_model as im
    from common import Row, Target
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.compare.passes import run_batches
    from inspect_model.methods.compare.sides import EagerSide

    name = ctx.sizes.cnn
    a, b = ctx.model(name), ctx.model(name)  # the same seed: identical weights, two resident copies
    tuned = ctx.model(name)
    with torch.no_grad():  # a fine-tune's worth of change: every weight moved by ~0.1 %, every layer differs
        g = torch.Generator().manual_seed(1)
        for p in tuned.parameters():
            p.mul_(1 + 1e-3 * torch.randn(p.shape, generator=g).to(p.device))
    x = ctx.images(ctx.sizes.batch)
    pairs = {n: n for n in select_layers(a)}

    def floor() -> None:
        with torch.no_grad():
            a(x)

    def ours() -> None:
        done = run_batches(a, EagerSide(b, pairs), [x], lambda t: ((t,), {}), pairs, tolerance=1e-3, low=None)
        assert done.peak_bytes <= (done.budget or 0) and all(s.sq_d == 0.0 for s in done.sums.values())

    def differing() -> None:
        done = run_batches(a, EagerSide(tuned, pairs), [x], lambda t: ((t,), {}), pairs, tolerance=1e-3, low=None)
        assert all(s.sq_d > 0.0 for s in done.sums.values())

    def api() -> None:
        im.compare(a, x, against_model=b)

    t = ctx.time({"floor": floor, "ours": ours, "differing": differing, "api": api})
    work = f"{name}, batch {ctx.sizes.batch} at {ctx.sizes.size} px, {len(pairs)} layers"
    return [
        Row(TITLE, f"compare two resident models (B ahead within its budget, {work})", t["ours"], t["floor"],
            Target("ratio", 2.3, "<= 2.3x one forward of A"), floor_what="one no-grad forward of A",
            note="B's layer outputs held up to the budget (256 MiB)"),
        Row(TITLE, f"compare a model with a fine-tuned copy (every layer differs; {work})", t["differing"],
            t["floor"], Target("ratio", 2.3, "<= 2.3x one forward of A"), floor_what="one no-grad forward of A",
            note="+ |a-b| and the share beyond the tolerance per layer"),
        Row(TITLE, f"im.compare API call (B copied, matched, report; {work})", t["api"], t["floor"],
            Target("info", 0.0, "information"), floor_what="one no-grad forward of A"),
    ]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import run

    raise SystemExit(run.run(["--only", TITLE, *sys.argv[1:]]))
