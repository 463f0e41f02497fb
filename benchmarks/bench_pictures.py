"""Pictures written as fast as the model runs (issue 15): four ratios, measured in one run.

    python benchmarks/bench_pictures.py [--model resnet18] [--images 64] [--batch 16]
                                        [--memory-images 1000] [--repeats 2]

1. ``cam -o`` (an overlay and a heat map per image, contact sheets, report.html) against
   ``cam --json`` (the same computation, no files), on the same ``--images`` images
   (451x300 JPEG-like pictures, resized/cropped to 224): target <= 1.3x.
2. One activation grid PNG (64 channels of 56x56, title, channel labels, colour bar)
   against torchvision's ``make_grid`` + ``save_image`` of the same tensor: target <= 1.0x.
3. ``grads -o`` (gradient-flow plot, histogram pages, report.html) against ``grads``: <= 1.3x.
4. Peak memory with ``cam -o`` over ``--memory-images`` images on a tiny net: the peak RSS
   over the last 10% of the images against the peak over the first 10% (flat: ~1.0x).

Every timing is the best of ``--repeats`` interleaved runs, through the Python API (what
the CLI calls) with the model loaded once (``--weights none``: no download). Exit status
1 when a target is missed.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in runs.items()}


def make_images(folder: Path, n: int, size: tuple[int, int] = (451, 300)) -> list[str]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    paths = []
    for i in range(n):
        fx, fy = rng.uniform(0.01, 0.05, 2)
        base = np.stack([np.sin(xx * fx + i), np.cos(yy * fy - i), np.sin((xx + yy) * 0.02)], -1)
        img = ((base * 0.5 + 0.5) * 200 + rng.integers(0, 55, (h, w, 3))).clip(0, 255).astype(np.uint8)
        p = folder / f"img{i:04d}.jpg"
        Image.fromarray(img).save(p, quality=90)
        paths.append(str(p))
    return paths


def rss() -> int:
    with open("/proc/self/statm") as fh:
        import os

        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--memory-images", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--parts", default="cam,grid,grads,memory", help="which measures to take (comma-separated)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))

    import torch
    from torchvision.utils import make_grid, save_image

    import inspect_model as im
    from inspect_model.run.options import InputOptions, ModelOptions
    from inspect_model.loading.sources import load_model
    from inspect_model.output.files import png_bytes
    from inspect_model.render.grids import render_activation

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pictures-"))
    failed = False
    try:
        paths = make_images(tmp, args.images)
        loaded = load_model(args.model, weights=None)
        mopts = ModelOptions(loaded, weights=None)
        inputs = InputOptions(paths, batch_size=args.batch)
        print(f"{args.model}, weights none, {args.images} images 451x300 -> 224, batch {args.batch}, CPU, "
              f"{torch.get_num_threads()} torch threads; best of {args.repeats} interleaved runs")
        runs = {"n": 0}

        def out_dir() -> Path:
            runs["n"] += 1
            return tmp / f"out{runs['n']}"

        # 1. cam -o vs cam --json
        t = {"json": 1.0, "files": 1.0} if "cam" not in parts else best({
            "json": lambda: im.cam(loaded, model_options=mopts, inputs=inputs, keep=False).to_dict(),
            "files": lambda: im.cam(loaded, model_options=mopts, inputs=inputs, output_dir=out_dir()),
        }, args.repeats)
        n_png = len(list((tmp / f"out{runs['n']}").rglob("*.png")))
        r1 = t["files"] / t["json"]
        if "cam" in parts:
                print(f"cam --json {t['json']:.2f} s; cam -o {t['files']:.2f} s ({n_png} PNGs): ratio {r1:.2f}x "
                  f"(target <= 1.3x)")
        failed |= r1 > 1.3

        # 2. one grid PNG vs make_grid + save_image
        x = torch.randn(64, 56, 56)
        a = x.numpy()

        def ours() -> bytes:
            img, _ = render_activation(a, 0, title="layer1.0.conv1 (Conv2d) - img0000.jpg")
            return png_bytes(img)

        def tv() -> bytes:
            buf = io.BytesIO()
            save_image(make_grid(x[:, None], nrow=8, normalize=True), buf, format="png")
            return buf.getvalue()

        if "grid" in parts:
            ours(), tv()
            t = best({"torchvision": tv, "ours": ours}, max(5, args.repeats * 5))
            r2 = t["ours"] / t["torchvision"]
            print(f"64-channel grid PNG: make_grid + save_image {1000 * t['torchvision']:.1f} ms; ours (title, "
                  f"labels, colour bar) {1000 * t['ours']:.1f} ms: ratio {r2:.2f}x (target <= 1.0x)")
            failed |= r2 > 1.0

        # 3. grads -o vs grads
        t = {"plain": 1.0, "files": 1.0} if "grads" not in parts else best({
            "plain": lambda: im.grads(loaded, model_options=mopts, inputs=inputs, keep=False).to_dict(),
            "files": lambda: im.grads(loaded, model_options=mopts, inputs=inputs, output_dir=out_dir()),
        }, args.repeats)
        r3 = t["files"] / t["plain"]
        if "grads" in parts:
            print(f"grads {t['plain']:.2f} s; grads -o {t['files']:.2f} s: ratio {r3:.2f}x (target <= 1.3x)")
        failed |= r3 > 1.3

        # 4. flat memory over many images with -o (a tiny net: the pictures dominate)
        if "memory" not in parts:
            return 1 if failed else 0
        n = args.memory_images
        (tmp / "mem").mkdir()
        few = make_images(tmp / "mem", min(n, 50), (160, 120))
        mem_paths = []
        for i in range(n):  # n distinct files (a path given twice is read once)
            p = tmp / "mem" / f"m{i:05d}.jpg"
            if str(p) not in few:
                shutil.copyfile(few[i % len(few)], p)
            mem_paths.append(str(p))
        tiny = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                                   torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(8, 10)).eval()
        samples: list[tuple[int, int]] = []
        done = {"n": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((done["n"], rss()))
                time.sleep(0.005)

        def count(_line: dict[str, Any]) -> None:
            done["n"] += 1
            samples.append((done["n"], rss()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        im.cam(tiny, inputs=InputOptions(mem_paths, batch_size=16, resize=64, crop=64, mean="0.5,0.5,0.5",
                                         std="0.25,0.25,0.25"),
               model_options=ModelOptions(tiny), output_dir=out_dir(), keep=False, on_item=count)
        stop.set()
        sampler.join()
        tenth = max(n // 10, 1)
        first = max((m for k, m in samples if k <= tenth), default=0)
        last = max((m for k, m in samples if k >= n - tenth), default=0)
        r4 = last / first if first else float("nan")
        print(f"cam -o over {n} images (tiny net, {time.perf_counter() - t0:.1f} s): peak RSS over the first "
              f"{tenth} images {first / 2**20:.0f} MiB, over the last {tenth} {last / 2**20:.0f} MiB: "
              f"ratio {r4:.2f}x (flat: <= 1.1x)")
        failed |= not r4 <= 1.1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


TITLE = "pictures"


def measure(ctx):  # type: ignore[no-untyped-def]
    """`cam -o` (overlays, heat maps, contact sheets, report.html) against `cam --json`
    (issue 15: <= 1.3x), and one activation grid PNG against make_grid + save_image (<= 1.0x)."""
    import torch
    from torchvision.utils import make_grid, save_image

    import inspect_model as im
    from common import Row, Target
    from inspect_model.run.options import InputOptions, ModelOptions
    from inspect_model.loading.models import load_model
    from inspect_model.output.files import png_bytes
    from inspect_model.render.grids import render_activation

    rows = []
    n = {"full": 64, "quick": 8, "smoke": 2}[ctx.mode]
    tmp = Path(tempfile.mkdtemp(prefix="bench-pictures-"))
    try:
        paths = make_images(tmp, n)
        loaded = load_model(ctx.sizes.cnn, weights=None, device=str(ctx.device))
        mopts = ModelOptions(loaded, weights=None, device=str(ctx.device))
        inputs = InputOptions(paths, batch_size=min(16, n))
        count = {"n": 0}

        def out_dir() -> Path:
            count["n"] += 1
            return tmp / f"out{count['n']}"

        t = ctx.time({"floor": lambda: im.cam(loaded, model_options=mopts, inputs=inputs, keep=False).to_dict(),
                      "ours": lambda: im.cam(loaded, model_options=mopts, inputs=inputs, output_dir=out_dir())})
        rows.append(Row("pictures", f"cam -o, {n} images 451x300", t["ours"], t["floor"],
                        Target("ratio", 1.3, "<= 1.3x cam --json"), floor_what="cam --json"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    x = torch.randn(64, 56, 56)
    a = x.numpy()

    def ours() -> bytes:
        img, _ = render_activation(a, 0, title="layer1.0.conv1 (Conv2d) - img0000.jpg")
        return png_bytes(img)

    def tv() -> bytes:
        buf = io.BytesIO()
        save_image(make_grid(x[:, None], nrow=8, normalize=True), buf, format="png")
        return buf.getvalue()

    t = ctx.time({"floor": tv, "ours": ours}, repeats=max(3, ctx.repeats * 3))
    rows.append(Row("pictures", "activation grid PNG (64 channels 56x56)", t["ours"], t["floor"],
                    Target("ratio", 1.0, "<= 1.0x torchvision"), floor_what="make_grid + save_image"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
