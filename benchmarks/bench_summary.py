"""Benchmark for `inspect-model summary` (issue 2), printing ratios measured in one run.

1. `summary vit_h_14` against torchinfo on the same model and input (target: >= 20x faster;
   peak memory within 1.2x of a bare `import torch, torchvision`).
2. `inspect-model summary resnet34` end to end against `python -c "import torch, torchvision"`
   (target: <= 1.15x).
3. `inspect-model --help` wall time (target: < 0.3 s).

Each measurement runs in a fresh subprocess so that imports and peak RSS are comparable;
the baseline is measured in the same run. torchinfo is optional (`pip install torchinfo`,
in the `bench` extra); without it that comparison is skipped with a message.

Run: python benchmarks/bench_summary.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PY = sys.executable
BIN = os.path.join(os.path.dirname(PY), "inspect-model")

# Child programs print {"seconds": work time, "peak_rss_mb": ru_maxrss} as JSON.
MEASURE = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
{body}
t1 = time.perf_counter()
print(json.dumps({{"seconds": t1 - t0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

BARE_IMPORT = "import torch, torchvision"
OURS_VIT = """
import torch, torchvision
t_start = time.perf_counter()
from inspect_model.api import summary
res = summary("vit_h_14")
assert res.total_params == 632045800, res.total_params
"""
TORCHINFO_VIT = """
import torch, torchvision
import torchinfo
m = torchvision.models.vit_h_14()
torchinfo.summary(m, input_size=(1, 3, 224, 224), verbose=0)
"""


def child(body: str) -> dict[str, float]:
    out = subprocess.run([PY, "-c", MEASURE.format(body=body)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return time.perf_counter() - t


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.repeat

    print("== summary vit_h_14 vs torchinfo (input 1x3x224x224) ==")
    bare = [child(BARE_IMPORT) for _ in range(n)]
    ours = [child(OURS_VIT) for _ in range(n)]
    bare_rss = median([b["peak_rss_mb"] for b in bare])
    ours_rss = median([o["peak_rss_mb"] for o in ours])
    # Work time: the child's total minus its own import time (same imports in both).
    ours_t = median([o["seconds"] for o in ours]) - median([b["seconds"] for b in bare])
    print(f"bare import torch, torchvision: peak RSS {bare_rss:.0f} MB")
    print(f"inspect-model summary:          {ours_t:.3f} s of work, peak RSS {ours_rss:.0f} MB "
          f"({ours_rss / bare_rss:.2f}x bare import; target <= 1.2x)")
    try:
        import torchinfo  # noqa: F401

        ti = [child(TORCHINFO_VIT) for _ in range(max(1, n // 2))]
        ti_t = median([t["seconds"] for t in ti]) - median([b["seconds"] for b in bare])
        ti_rss = median([t["peak_rss_mb"] for t in ti])
        print(f"torchinfo.summary:              {ti_t:.3f} s of work, peak RSS {ti_rss:.0f} MB")
        print(f"speed-up over torchinfo: {ti_t / max(ours_t, 1e-6):.1f}x (target >= 20x)")
    except ImportError:
        print("torchinfo not installed (pip install torchinfo): comparison skipped")

    print("\n== inspect-model summary resnet34 end to end vs python -c 'import torch, torchvision' ==")
    base = [wall([PY, "-c", BARE_IMPORT]) for _ in range(n)]
    cli = [wall([BIN, "summary", "resnet34"]) for _ in range(n)]
    print(f"import only: {median(base):.3f} s; summary resnet34: {median(cli):.3f} s; "
          f"ratio {median(cli) / median(base):.2f}x (target <= 1.15x)")

    print("\n== inspect-model --help ==")
    helps = [wall([BIN, "--help"]) for _ in range(n)]
    sub = [wall([BIN, "summary", "--help"]) for _ in range(n)]
    print(f"--help: {median(helps):.3f} s; summary --help: {median(sub):.3f} s (target < 0.3 s)")


TITLE = "summary"


def measure(ctx):  # type: ignore[no-untyped-def]
    """`summary NAME` (the model built on the meta device, no weights) against torchinfo on
    the same model as its users run it (the model built, then summarised; issue 2: >= 20x,
    set on vit_h_14, the full mode's model; quick and smoke use a small CNN and report the
    speed-up without judging it); `--help` wall time. Floor: one plain forward at batch 1."""
    import torch
    from torchvision import models

    import inspect_model as im
    from common import Row, Target

    name = "vit_h_14" if ctx.mode == "full" else ctx.sizes.cnn
    size = 224 if name.startswith("vit") else ctx.sizes.size
    model = ctx.model(name)
    x = ctx.images(1, size)

    def floor() -> None:
        with torch.no_grad():
            model(x)

    fns = {"floor": floor, "ours": lambda: im.summary(name, input_size=[[3, size, size]])}
    if ctx.peers["torchinfo"]:
        import torchinfo

        fns["peer"] = lambda: torchinfo.summary(models.get_model(name, weights=None).to(ctx.device),
                                                input_size=(1, 3, size, size), verbose=0, device=ctx.device)
    t = ctx.time(fns, repeats=1 if name.startswith("vit") else None)
    target = (Target("speedup", 20, ">= 20x torchinfo") if name == "vit_h_14"
              else Target("info", 0, "(20x torchinfo: set on vit_h_14, full mode)"))
    rows = [Row("summary", f"summary {name} by name ({size} px)", t["ours"], t["floor"], target,
                peer=t.get("peer"), peer_name="torchinfo (model built + summary)", floor_what="forward, batch 1")]
    helps = [wall([BIN, "--help"]) for _ in range(ctx.repeats)]
    bare = [wall([PY, "-c", "pass"]) for _ in range(ctx.repeats)]
    rows.append(Row("summary", "inspect-model --help (wall)", min(helps), min(bare), Target("max", 0.3, "<= 0.3 s"),
                    floor_what="python -c pass"))
    return rows


if __name__ == "__main__":
    main()
