"""Peak memory of `activations` statistics on every layer of resnet152, against a plain forward.

Issue 4: with every layer of resnet152 selected for statistics, peak memory stays within
1.3x of a plain forward pass with no hooks. Both runs happen in this one process, on the
same model and input, under ``torch.no_grad()`` (the capture runs without autograd too),
each after a warm-up, alternating, best of ``--repeats``. Three measures:

* process peak RSS (VmHWM, reset through /proc/self/clear_refs before each run): what a
  user sees; it includes the weights (~230 MB for resnet152), so it is the headline ratio;
* peak RSS above the RSS just before the run: the activations' own memory;
* peak of live bytes from torch's CPU allocator (torch.profiler, profile_memory=True):
  the same, free of malloc caching effects.

Run: python benchmarks/bench_activations_memory.py [--batch 2] [--size 224] [--repeats 3]
Exit status 1 if the headline ratio is above --limit (1.3).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from typing import Any


def _status(field: str) -> int:
    """A VmXXX field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _trim() -> None:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_peak(fn: Callable[[], Any]) -> tuple[int, int]:
    """(peak RSS during fn, RSS just before fn), in bytes."""
    gc.collect()
    _trim()
    if not _reset_peak():
        raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs); Linux only")
    before = _status("VmRSS")
    fn()
    return _status("VmHWM"), before


def allocator_peak(fn: Callable[[], Any]) -> int:
    """Peak of live bytes from torch's CPU allocator during fn, replayed from the profiler's
    memory records: each op's own (self) allocations at its start, frees outside ops at
    their time. Transients allocated and freed inside one op net to zero here."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
              if e.self_cpu_memory_usage]
    events.sort(key=lambda ev: ev[0])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def _return_freed_memory_to_os() -> None:
    """Make RSS follow live memory: blocks of 128 KiB and more are mmap-ed (and unmapped
    when freed) instead of staying in glibc's heap, for both runs alike."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (also stops its dynamic growth)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS deltas then include cached memory
        print("note: not glibc; RSS deltas include memory cached by malloc")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=float, default=1.3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()

    import torch
    import torchvision

    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.activations.capture import ActivationCapture

    if args.threads:
        torch.set_num_threads(args.threads)
    _return_freed_memory_to_os()
    torch.manual_seed(0)
    model = torchvision.models.resnet152(weights=None).eval()
    x = torch.rand(args.batch, 3, args.size, args.size)
    layers = select_layers(model)  # every leaf
    cap = ActivationCapture(model, layers)

    def plain() -> None:
        with torch.no_grad():
            y = model(x)
        del y

    def hooked() -> None:
        with cap:
            res = cap.run(x)
        del res

    for fn in (plain, hooked):  # warm-up: oneDNN primitives, allocator pools
        fn()
    rows: dict[str, list[tuple[int, int, int, float]]] = {"plain": [], "hooked": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("hooked", hooked)):
            t0 = time.perf_counter()
            peak, before = rss_peak(fn)
            dt = time.perf_counter() - t0
            rows[name].append((peak, before, allocator_peak(fn), dt))
    cap_report = cap.report()

    def best(name: str) -> tuple[int, int, int, float]:
        r = rows[name]
        return (min(p for p, _, _, _ in r), min(p - b for p, b, _, _ in r), min(a for _, _, a, _ in r),
                min(t for _, _, _, t in r))

    p_peak, p_delta, p_alloc, p_t = best("plain")
    h_peak, h_delta, h_alloc, h_t = best("hooked")
    mib = 2.0**20
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"resnet152 (weights none), input {args.batch}x3x{args.size}x{args.size}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {len(layers)} layers hooked "
          f"({len(cap_report.layers)} rows), best of {args.repeats}")
    print(f"weights: {params / mib:.1f} MiB")
    print(f"{'measure':44s} {'plain':>10s} {'stats':>10s} {'ratio':>7s}")
    print(f"{'process peak RSS (MiB)':44s} {p_peak / mib:10.1f} {h_peak / mib:10.1f} {h_peak / p_peak:7.3f}")
    print(f"{'peak RSS above RSS before the pass (MiB)':44s} {p_delta / mib:10.1f} {h_delta / mib:10.1f} "
          f"{h_delta / max(p_delta, 1):7.3f}")
    print(f"{'peak live bytes, torch CPU allocator (MiB)':44s} {p_alloc / mib:10.1f} {h_alloc / mib:10.1f} "
          f"{h_alloc / max(p_alloc, 1):7.3f}")
    print(f"{'time (s)':44s} {p_t:10.3f} {h_t:10.3f} {h_t / p_t:7.2f}")
    ratio = h_peak / p_peak
    ok = ratio <= args.limit
    print(f"peak memory ratio (process peak RSS): {ratio:.3f} (limit {args.limit}) -> {'OK' if ok else 'OVER'}")
    return 0 if ok else 1


TITLE = "activations"


def measure(ctx):  # type: ignore[no-untyped-def]
    """Statistics of every leaf layer against a plain no-grad forward: time (issue 16: the
    throughput at least 0.8x the floor's, i.e. <= 1.25x its time) and peak memory (issue 4:
    <= 1.3x; process RSS on a CPU, the allocator's peak on CUDA; resnet152 in full mode)."""
    import torch

    from common import Row, Target
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.activations.capture import ActivationCapture

    rows = []
    for name in ctx.sizes.models:
        model = ctx.model(name)
        x = ctx.images(ctx.sizes.batch, 224 if name.startswith("vit") else None)
        cap = ActivationCapture(model, select_layers(model))

        def plain(model=model, x=x) -> None:  # type: ignore[no-untyped-def]
            with torch.no_grad():
                model(x)

        def hooked(cap=cap, x=x) -> None:  # type: ignore[no-untyped-def]
            with cap:
                cap.run(x)

        t = ctx.time({"floor": plain, "ours": hooked})
        rows.append(Row("activations", f"activations statistics, every leaf, {name} batch {x.shape[0]}", t["ours"],
                        t["floor"], Target("ratio", 1.15, "<= 1.15x floor"), floor_what="no-grad forward"))
    name = "resnet152" if ctx.mode == "full" else ctx.sizes.cnn
    model = ctx.model(name)
    x = ctx.images(2 if ctx.mode == "full" else ctx.sizes.batch)
    cap = ActivationCapture(model, select_layers(model))

    def plain_m() -> None:
        with torch.no_grad():
            model(x)

    def hooked_m() -> None:
        with cap:
            cap.run(x)

    peaks = {}
    for label, fn in (("floor", plain_m), ("ours", hooked_m)):
        fn()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(ctx.device)
            fn()
            torch.cuda.synchronize()
            peaks[label] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
        elif _reset_peak():
            peaks[label] = min(rss_peak(fn)[0] for _ in range(ctx.repeats)) / 2**20
    if peaks:
        what = "CUDA allocator peak" if ctx.device.type == "cuda" else "process peak RSS"
        rows.append(Row("memory", f"activations statistics, every leaf, {name} batch {x.shape[0]}: {what}",
                        peaks["ours"], peaks["floor"], Target("ratio", 1.3, "<= 1.3x floor"), unit="MiB",
                        floor_what="no-grad forward"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
