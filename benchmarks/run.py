"""Every benchmark in one run, one table: the work, our time, the floor (what the work cannot
avoid, measured in this process on this device), the ratio, the peer's ratio where the peer
is installed (the ``bench`` extra: torchinfo, pytorch-grad-cam, captum), the target and
whether it is met.

    python benchmarks/run.py [--device cpu|cuda|mps] [--quick | --smoke] [--only cam,faithfulness|issue40]
                             [--clock wall|cpu] [--threads N]
                             [--repeats N] [--json FILE] [--markdown]

The device defaults to CUDA when ``torch.cuda.is_available()``, else the CPU. Sizes follow
the device and the mode (benchmarks/common.py ``sizes_for``): on an accelerator batch 64 at
224 px, resnet50 and vit_b_16; on a CPU what a small machine runs (``--quick`` in under 3
minutes on 2 cores; ``--smoke`` is the seconds-long CI check that everything runs, its
numbers mean nothing). A benchmark joins by adding its module to ``BENCHES``: a module with
``TITLE`` and ``measure(ctx) -> list[Row]`` (benchmarks/common.py). Each bench_*.py also
runs alone with its own, more detailed output.

Exit status: 0 when every benchmark ran (a missed target is a FAIL in the table, not an
error), 1 when one raised (its error is in the table).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# One entry per benchmark module, in table order. New commands (attention, attributions) add theirs.
BENCHES = [
    "bench_summary",
    "bench_activations_memory",
    "bench_grads",
    "bench_guided_backprop",
    "bench_cam",
    "bench_evaluate",
    "bench_attention",
    "bench_attributions",
    "bench_patch",
    "bench_video",
    "bench_dataset",
    "bench_pictures",
    "bench_leaks",
    "bench_offload",
    "bench_lens",
    "bench_compare",
]


# --only takes these names for several benchmarks at once.
GROUPS = {
    # issue 40's rows: grads, activation statistics, --evaluate, Score-CAM, IG at equal gap, cam -o, --workers 0
    "issue40": ["bench_grads", "bench_activations_memory", "bench_evaluate", "bench_cam", "bench_attributions",
                "bench_dataset", "bench_pictures"],
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: cuda when available)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes: under 3 minutes on a 2-core CPU")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: does everything run (CI)")
    ap.add_argument("--only", default="", help="comma-separated benchmark titles or module names, or a group: "
                    + ", ".join(GROUPS))
    ap.add_argument("--repeats", type=int, default=0, help="best of N interleaved runs (default 3; quick 2; smoke 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and the machine to FILE")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (README's)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time each run by this process's CPU time (a machine shared with other jobs; "
                         "use with --threads 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    return ap.parse_args(argv)


def pick_device(name: str | None) -> Any:
    """``name``, else CUDA when ``torch.cuda.is_available()``, else the CPU."""
    import torch

    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def machine(device: Any) -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "device": str(device), "python": platform.python_version()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def run(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from common import PEERS, Context, Row, Target, have, sizes_for

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    repeats = args.repeats or {"full": 3, "quick": 2, "smoke": 1}[mode]
    ctx = Context(device, mode, repeats, sizes_for(device.type, mode), {p: have(p) for p in PEERS}, clock=args.clock)
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    for group in wanted & set(GROUPS):
        wanted |= set(GROUPS[group])
    load0 = os.getloadavg()
    start, cpu0 = time.perf_counter(), time.process_time()
    rows: list[Row] = []
    errors = 0
    for name in BENCHES:
        mod = importlib.import_module(name)
        if wanted and not wanted & {name, mod.TITLE}:
            continue
        ctx.log(f"[{time.perf_counter() - start:6.1f} s] {mod.TITLE} ...")
        try:
            rows += mod.measure(ctx)
        except Exception as exc:  # noqa: BLE001 - one benchmark's failure is a row, the others still run
            errors += 1
            ctx.log(traceback.format_exc())
            rows.append(Row(mod.TITLE, f"{mod.TITLE}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:80]}",
                            float("nan"), None, Target("info", text="ran")))
            rows[-1].result = False
    elapsed = time.perf_counter() - start
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = time.process_time() - cpu0 + kids.ru_utime + kids.ru_stime
    meta = machine(device) | {"mode": mode, "repeats": repeats, "seconds": round(elapsed, 1), "clock": args.clock,
                              "cpu_seconds": round(cpu_s, 1),
                              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              "load_average": [round(v, 1) for v in (load0[0], os.getloadavg()[0])],
                              "peers": {p: ok for p, ok in ctx.peers.items()}}
    print(render(rows, meta, markdown=args.markdown))
    judged = [r for r in rows if r.result is not None]
    failed = [r.work for r in judged if not r.result]
    print(f"targets: {len(judged) - len(failed)} PASS, {len(failed)} FAIL"
          + ("".join(f"\n  FAIL: {w}" for w in failed) if failed else ""))
    if args.json:
        doc = {"machine": meta, "rows": [r.to_dict() for r in rows]}
        text = json.dumps(_finite(doc), indent=2, sort_keys=True, default=str, allow_nan=False)
        args.json.write_text(text + "\n")
    return 1 if errors else 0


def _finite(v: Any) -> Any:
    """NaN (a benchmark that failed) written as null."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def fmt(v: float | None, unit: str = "s") -> str:
    if v is None or v != v:
        return "-"
    if unit == "s":
        return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "s/img":
        return f"{v * 1e3:.1f} ms/img"
    return f"{v:.0f} {unit}"


def render(rows: list[Any], meta: dict[str, Any], *, markdown: bool) -> str:
    """The table; the peer columns only when a peer is installed."""
    peers = any(meta["peers"].values())
    head = ["work", "ours", "floor", "ratio"] + (["peer ratio", "vs peer"] if peers else []) + ["target", "result"]
    body = []
    for r in rows:
        cells = [r.work, fmt(r.ours, r.unit), fmt(r.floor, r.unit) + (f" ({r.floor_what})" if r.floor_what else ""),
                 f"{r.ratio:.2f}x" if r.ratio is not None else "-"]
        if peers:
            cells += [f"{r.peer_ratio:.2f}x" if r.peer_ratio is not None else "-",
                      f"{r.peer / r.ours:.2f}x {r.peer_name}" if r.peer is not None and r.ours else "-"]
        cells += [r.target.text, {True: "pass", False: "FAIL", None: "-"}[r.result]]
        if r.note:
            cells[0] += f" [{r.note}]"
        body.append(cells)
    missing = [p for p, ok in meta["peers"].items() if not ok]
    where = (f"Measured {meta['date']} on {meta['device']}" + (f" ({meta['gpu']})" if "gpu" in meta else "")
             + f", {meta['cpu']}, {meta['cores']} cores, torch {meta['torch']} ({meta['threads']} threads), "
             f"{meta['mode']} mode, best of {meta['repeats']} interleaved runs"
             + (" timed by process CPU time" if meta.get("clock") == "cpu" else "")
             + f", {meta['seconds']:.0f} s in all "
             f"({meta.get('cpu_seconds', 0):.0f} s of CPU time); "
             f"load average {meta['load_average'][0]} at the start, {meta['load_average'][1]} at the end"
             + (f"; peers not installed (columns empty): {', '.join(missing)}" if missing else "") + ".")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in body]
        return "\n".join(lines) + "\n\n" + where
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in body]
    return "\n".join(out) + "\n" + where


if __name__ == "__main__":
    sys.exit(run())
